"""Service configuration: one pydantic-settings class, read from `POSENC_*` variables when built.

Nothing reads the environment at import time: `Settings()` is constructed by the CLI or the app
factory and passed into `create_app(settings)`.
"""

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024

# The model repository shipped with the source tree (onnx/ beside service/).
DEFAULT_MODEL_REPOSITORY = Path(__file__).resolve().parent.parent / "onnx"


class Settings(BaseSettings):
    """Every knob of the service; the env variable is `POSENC_<FIELD NAME IN UPPER CASE>`."""

    model_config = SettingsConfigDict(env_prefix="POSENC_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address `posenc serve` binds to.")
    port: int = Field(8000, ge=1, le=65535, description="Port `posenc serve` listens on.")
    workers: int = Field(1, ge=1, le=64, description="Worker processes for `posenc serve`.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")

    max_table_bytes: int = Field(
        256 * MiB, ge=1, description="Largest table response in bytes (computed before allocating); over it: 413."
    )
    max_json_elements: int = Field(
        1 << 20, ge=1, description="Largest number of elements served as `format=json`; over it: 413."
    )
    cache_bytes: int = Field(
        256 * MiB, ge=0, description="Byte budget of the in-memory LRU cache of encoded table responses (0 = off)."
    )
    max_request_bytes: int = Field(
        64 * MiB, ge=1, description="Largest request body accepted (uploads, inference); over it: 413."
    )
    model_repository: Path = Field(
        DEFAULT_MODEL_REPOSITORY, description="Folder of `<model>/model.onnx` + `<model>/config.json`."
    )
