"""`posenc calibrate`: where each model's CPU form starts to win on this machine, the measurement the service
makes at start-up (`posenc.service.inference.calibration`), shown with its timings; `--write` records the
lengths in config.json (the value POSENC_CPU_FORM_FROM=config uses)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posenc.models.crossover import crossover
from posenc.service.cli.settings_from_env import settings_or_exit


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "calibrate", help="measure from which sequence length each model's CPU form is faster on this machine",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repository", type=Path, help="model repository (default: POSENC_MODEL_REPOSITORY)")
    parser.add_argument("--write", action="store_true", help="record the lengths in each config.json")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import onnxruntime as ort

    from posenc.service.inference.calibration import Machine, config_inputs, time_forms
    from posenc.service.inference.repository import cpu_model_file, model_folders

    settings = settings_or_exit()
    repository = args.repository or Path(settings.model_repository)
    if not repository.is_dir():
        print(f"posenc calibrate: {repository} is not a folder")
        return 2
    machine = Machine.here()
    threads = settings.intra_op_num_threads or machine.cores
    print(f"{machine.cpu} ({' '.join(machine.isa) or 'no listed ISA'}), {machine.cores} cores, "
          f"onnxruntime {ort.__version__}, {threads} intra-op threads")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for folder in model_folders(repository):
        config = json.loads((folder / "config.json").read_text())
        entry = cpu_model_file(config)
        if entry is None:
            print(f"{folder.name}: no CPU form")
            continue
        sessions = [ort.InferenceSession(folder / name, sess_options=options, providers=["CPUExecutionProvider"])
                    for name in ("model.onnx", entry[0])]
        timings = time_forms(sessions[0], sessions[1], config_inputs(config), deadline=time.monotonic() + 3600)
        if timings is None:
            print(f"{folder.name}: not measured within an hour")
            return 1
        from_sequence = crossover(timings.sequences, timings.standard, timings.form)
        print(f"{folder.name}: {entry[0]} from sequence {from_sequence or 'never'} (config.json: {entry[2]})")
        for seq, standard, form in zip(timings.sequences, timings.standard, timings.form, strict=True):
            print(f"  S={seq:5d}  model.onnx {standard * 1e3:9.3f} ms  {entry[0]} {form * 1e3:9.3f} ms  "
                  f"{standard / form:5.2f}x")
        if args.write:
            config["cpu_model"]["from_sequence"] = from_sequence
            (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return 0
