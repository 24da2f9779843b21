"""`posenc calibrate`: which of each model's CPU graphs runs fastest at each sequence length on this machine, the
measurement the service makes at start-up (`posenc.service.inference.runtime.calibration`), shown with its timings;
`--write` records the rule in config.json (`cpu_rule`: the rule POSENC_CPU_FORM_FROM=config uses); `--print`
writes the measured rules to stdout in the calibration cache's format (the table goes to stderr), the file
POSENC_CALIBRATION_RULES reads: a cluster measures once per node type and mounts it in every pod
(docs/deployment.md)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "calibrate", help="measure which CPU graph of each model is fastest at each sequence length here",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repository", type=Path, help="model repository (default: POSENC_MODEL_REPOSITORY)")
    parser.add_argument("--write", action="store_true", help="record the rule in each config.json")
    parser.add_argument("--print", action="store_true", dest="print_rules",
                        help="write the rules to stdout as a calibration file (POSENC_CALIBRATION_RULES), the "
                             "table to stderr; merges with --merge FILE (the rules of other machines)")
    parser.add_argument("--merge", type=Path, help="with --print: a calibration file whose entries are kept")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import onnxruntime as ort

    from posenc.models.graph_rule import STANDARD_FILE, cpu_forms_of, describe, rule_document
    from posenc.service.cli.settings_from_env import settings_or_exit
    from posenc.service.inference.runtime.calibration import (
        Machine,
        cache_entry,
        config_inputs,
        measuring_sessions,
        time_graphs,
    )
    from posenc.service.inference.runtime.calibration_cache import Refused, file_bytes, parse_entries
    from posenc.service.inference.runtime.repository import (
        ConfigError,
        ModelConfig,
        calibration_key,
        cpu_graphs,
        model_folders,
    )

    settings = settings_or_exit()
    repository = args.repository or Path(settings.model_repository)
    out = sys.stderr if args.print_rules else sys.stdout
    if not repository.is_dir():
        print(f"posenc calibrate: {repository} is not a folder", file=sys.stderr)
        return 2
    entries: dict[str, object] = {}
    if args.merge is not None:
        try:
            entries.update(parse_entries(args.merge.read_bytes()))
        except (OSError, Refused) as exc:
            print(f"posenc calibrate: --merge {args.merge}: {exc}", file=sys.stderr)
            return 2
    machine = Machine.here()
    threads = settings.intra_op_num_threads or machine.cores
    print(f"{machine.cpu} ({' '.join(machine.isa) or 'no listed ISA'}), {machine.cores} cores, "
          f"onnxruntime {ort.__version__}, {threads} intra-op threads", file=out)
    for folder in model_folders(repository):
        config = json.loads((folder / "config.json").read_text())
        try:
            forms, recorded = cpu_forms_of(config)
        except ValueError as exc:
            print(f"{folder.name}: {exc}", file=sys.stderr)
            return 2
        if not forms:
            print(f"{folder.name}: no CPU form", file=out)
            continue
        files = [STANDARD_FILE, *(form.file for form in forms)]
        sessions = measuring_sessions({file: str(folder / file) for file in files}, threads)
        timings = time_graphs(sessions, config_inputs(config), deadline=time.monotonic() + 3600)
        if timings is None:
            print(f"{folder.name}: not measured within an hour", file=sys.stderr)
            return 1
        if args.print_rules:
            try:
                graphs = cpu_graphs(ModelConfig.parse(folder.name, config), folder, forms)
            except (OSError, ConfigError) as exc:
                print(f"{folder.name}: {exc}", file=sys.stderr)
                return 2
            entries[calibration_key(graphs, threads)] = cache_entry(timings)
        rule = timings.rule()
        print(f"{folder.name}: {describe(rule)} (config.json: {describe(recorded) if recorded else 'model.onnx'})",
              file=out)
        print("  " + " ".join([f"{'S':>5}", *(f"{file:>20}" for file in files)]), file=out)
        for index, seq in enumerate(timings.sequences):
            cells = [f"{seconds * 1e3:17.3f} ms" if math.isfinite(seconds) else f"{'not timed':>20}"
                     for seconds in (timings.seconds[file][index] for file in files)]
            print("  " + " ".join([f"{seq:5d}", *cells]), file=out)
        if args.write and "cpu_forms" not in config:
            print(f"  not written: config.json has the one-form cpu_model of an earlier export; derive the forms "
                  f"first (python -m posenc.models.export.cpu_forms {repository})")
        elif args.write:
            config["cpu_rule"] = rule_document(rule)
            (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if args.print_rules:
        sys.stdout.buffer.write(file_bytes(entries) if entries else b"{}\n")
    return 0
