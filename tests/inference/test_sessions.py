"""Sessions shared between the engines of one process (`posenc.service.inference.runtime.sessions`): the same model
bytes,
options and providers give the same session once sharing is on, anything else a session of its own; failures are
never kept; the cache is bounded."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest

from posenc.service.inference.runtime import sessions
from posenc.service.inference.runtime.engine import Engine
from posenc.service.settings import Settings
from tests.onnx_models import REPOSITORY

CPU = ["CPUExecutionProvider"]
GRAPH = (REPOSITORY / "rope_attention" / "model.onnx").read_bytes()
OTHER_GRAPH = (REPOSITORY / "rope_attention" / "model.cpu.onnx").read_bytes()


def _options(threads: int = 1, spinning: str = "0") -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    return options


@pytest.fixture
def sharing() -> Iterator[None]:
    """Sharing on with an empty cache (limit 3); this suite's own sharing (tests/conftest.py) back afterwards."""
    sessions.stop_sharing()
    sessions.share_sessions(limit=3)
    yield
    sessions.stop_sharing()
    sessions.share_sessions()


@pytest.fixture
def not_sharing() -> Iterator[None]:
    sessions.stop_sharing()
    yield
    sessions.share_sessions()


def test_without_sharing_every_call_makes_a_session(not_sharing: None) -> None:
    assert sessions.new_session(GRAPH, _options(), CPU) is not sessions.new_session(GRAPH, _options(), CPU)


def test_the_same_bytes_options_and_providers_share_one_session(sharing: None) -> None:
    first = sessions.new_session(GRAPH, _options(), CPU)
    assert sessions.new_session(GRAPH, _options(), CPU) is first
    assert first.get_session_options().intra_op_num_threads == 1


@pytest.mark.parametrize("other", [
    (OTHER_GRAPH, _options(), CPU),  # other bytes
    (GRAPH, _options(threads=2), CPU),  # other threads
    (GRAPH, _options(spinning="1"), CPU),  # another config entry
    (GRAPH, _options(), [("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})]),  # provider options
])
def test_anything_else_gets_a_session_of_its_own(sharing: None, other: tuple) -> None:
    first = sessions.new_session(GRAPH, _options(), CPU)
    assert sessions.new_session(*other) is not first
    assert sessions.new_session(GRAPH, _options(), CPU) is first


def _add_constant(constant: float) -> bytes:
    """y = x + constant, the constant stored after 16 KiB of another initializer: two such models differ only in
    their last bytes."""
    from onnx import TensorProto, helper, numpy_helper

    padding = numpy_helper.from_array(np.zeros(4096, np.float32), "padding")
    value = numpy_helper.from_array(np.array([constant], np.float32), "constant")
    graph = helper.make_graph([helper.make_node("Add", ["x", "constant"], ["y"])], "add",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [padding, value])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_models_that_differ_in_their_last_bytes_answer_each_its_own(sharing: None) -> None:
    one, two = _add_constant(1.0), _add_constant(2.0)
    assert len(one) == len(two) and one[:16384] == two[:16384] and one != two
    x = {"x": np.zeros(1, np.float32)}
    assert sessions.new_session(one, _options(), CPU).run(None, x)[0].tolist() == [1.0]
    assert sessions.new_session(two, _options(), CPU).run(None, x)[0].tolist() == [2.0]


def test_a_model_that_fails_is_refused_every_time(sharing: None) -> None:
    for _ in range(2):
        with pytest.raises(Exception, match="INVALID_PROTOBUF"):  # onnxruntime's InvalidProtobuf
            sessions.new_session(b"not a model", _options(), CPU)


def test_the_least_recently_used_session_beyond_the_limit_is_dropped(sharing: None) -> None:
    first = sessions.new_session(GRAPH, _options(threads=1), CPU)
    for threads in (2, 3):
        sessions.new_session(GRAPH, _options(threads=threads), CPU)
    assert sessions.new_session(GRAPH, _options(threads=1), CPU) is first  # used again: now the most recent
    sessions.new_session(GRAPH, _options(threads=4), CPU)  # the fourth: threads=2 goes
    assert sessions.new_session(GRAPH, _options(threads=1), CPU) is first
    assert len(sessions._shared or {}) == 3


def test_two_engines_share_their_models_sessions(sharing: None) -> None:
    sessions.share_sessions(limit=256)  # room for every shipped model's sessions
    engines = [Engine(Settings(model_repository=str(REPOSITORY), intra_op_num_threads=1)) for _ in range(2)]
    for engine in engines:
        assert engine.load() == []
    one, two = (engine.models["gemma_2b_attention"] for engine in engines)
    assert one.session is two.session  # type: ignore[union-attr]
    assert one is not two
