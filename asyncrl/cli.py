"""The `asyncrl` command line.

    asyncrl demo [--task TASK] [--mode MODE] [--model-family F] [--setup-only] [--rebuild-setup] [key=value ...]
                                                  the main job on the embedded default task
    asyncrl train CONFIG.yaml [key=value ...]     train with a config file plus dotted overrides
    asyncrl sft --model DIR --data FILE --out DIR supervised warm start
    asyncrl config show [CONFIG.yaml] [key=value ...]
    asyncrl data make [TASK] --out DIR [--train-size N --val-size M --seed S --set knob=value]
                                                  (no TASK: the demo's task, with its knobs)
    asyncrl bench {engine,trainer,sync,modes,tools} ... prints a table, writes JSON under outputs/bench/
    asyncrl serve MODEL_DIR [--host H --port P --api-key K]   an OpenAI-compatible server (docs/serving.md)
    asyncrl check-server URL --model DIR [--api asyncrl|vllm]  is a server fit for RL rollouts? (named checks)
    asyncrl scale RUN_DIR --replicas N            grow or shrink a running run's rollout replicas (docs/cluster.md)

Errors in the user's input (config, data, reward function) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import textwrap

# OpenMP threads of every command (the demo's SFT in this process, a run's workers, `asyncrl serve`) sleep while
# they wait for each other instead of spinning on a core another process needs (asyncrl/launch/cpu_threads.py).
# OpenMP reads the setting once, when torch loads: so before the imports below load it. A user's own is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from asyncrl.config import ConfigError, dump_config, load_config  # noqa: E402  (after the OpenMP setting)
from asyncrl.config.docs import DEFAULT_OUTPUT as DEFAULT_DOCS_OUTPUT, check_or_write
from asyncrl.data.demo_tasks import DEFAULT_MODE, DEFAULT_TASK, DEMO_TASKS
from asyncrl.data.reader import DatasetError
from asyncrl.data.tasks import TASKS
from asyncrl.models.model_config import FAMILIES
from asyncrl.recipes.errors import IncompatibleCheckpointError
from asyncrl.rollout.agent import TOOL_CALL_PARSERS  # noqa: F401  (rollout.multi_turn.format's names, for the docs)
from asyncrl.rollout.readiness import add_arguments as add_check_arguments, main as check_server_main
from asyncrl.rewards.loader import RewardLoadError
from asyncrl.serving.options import add_serve_arguments

USER_ERRORS = (ConfigError, DatasetError, RewardLoadError, IncompatibleCheckpointError)
# Failures of a running job, reported as one line (matched by name: their modules import Ray and torch).
RUN_FAILURES = ("RemoteCallError", "RemoteTimeoutError", "PipelineStalledError", "NonFiniteTrainingError",
                "ResourceError")


def split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """[FILE] [key=value ...]: the file is the first argument without '='."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def command_config_show(options: argparse.Namespace) -> int:
    path, overrides = split_config_args(options.args)
    print(dump_config(load_config(path, overrides)), end="")
    return 0


def command_config_docs(options: argparse.Namespace) -> int:
    return check_or_write(options.out or DEFAULT_DOCS_OUTPUT, options.check)


def command_advise(options: argparse.Namespace) -> int:
    from asyncrl.telemetry.advisor import advise
    try:
        print(advise(options.run_dir).text())
    except FileNotFoundError as error:
        raise ConfigError(f"{options.run_dir} is not a run folder: {error}") from None
    return 0


def command_data_make(options: argparse.Namespace) -> int:
    from asyncrl.data.make import make_task, write_task
    from asyncrl.data.demo_tasks import demo_task
    name, knobs = options.task, {}
    if name is None:  # the demo's task, whose warm-started model (asyncrl demo --setup-only) it matches
        name, knobs = demo_task(DEFAULT_TASK).task, dict(demo_task(DEFAULT_TASK).knobs)
    for item in options.set:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KNOB=VALUE")
        key, value = item.split("=", 1)
        knobs[key] = value
    try:
        task = make_task(name, knobs)
    except (TypeError, ValueError) as error:
        raise ConfigError(str(error)) from None
    paths = write_task(task, options.out, options.train_size, options.val_size, options.seed)
    print(f"wrote {options.train_size} training and {options.val_size} validation prompts of {task}:")
    for path in paths.values():
        print(f"  {path}")
    return 0


def command_train(options: argparse.Namespace) -> int:
    path, overrides = split_config_args(options.args)
    config = load_config(path, overrides)  # validated before anything starts
    from asyncrl.launch import train
    summary = train(config)
    if "already_finished" in summary:  # a warning said why and how to train again; the command's goal holds: exit 0
        print(f"nothing to do: {summary['output_dir']} holds a finished run ({summary['last_step']} steps)")
        return 0
    from asyncrl.recipes.run_report import run_report
    print("\n".join(run_report(summary)))
    return 0


def command_demo(options: argparse.Namespace) -> int:
    from asyncrl.launch.demo import prepare_setup, run_demo
    if options.setup_only:
        setup = prepare_setup(options.out, options.task, rebuild=options.rebuild_setup, family=options.model_family)
        print(f"warm-started model: {setup.model}\ntraining prompts:   {setup.train_file}\n"
              f"validation prompts: {setup.val_file}")
        return 0
    run_demo(options.out, mode=options.mode, overrides=options.overrides, task_name=options.task,
             rebuild_setup=options.rebuild_setup, family=options.model_family)
    return 0


def command_sft(options: argparse.Namespace) -> int:
    from asyncrl.train.sft import SFTSettings, run_sft
    settings = SFTSettings(epochs=options.epochs, batch_size=options.batch_size, lr=options.lr, seed=options.seed,
                           device=options.device)
    folder = run_sft(options.model, options.data, options.out, settings)
    print(f"wrote the warm-started policy to {folder}")
    return 0


def command_serve(options: argparse.Namespace) -> int:
    from asyncrl.serving.cli import serve
    return serve(options)


BENCHMARKS = {"engine": "asyncrl.bench.engine", "trainer": "asyncrl.bench.trainer", "sync": "asyncrl.bench.sync",
              "modes": "asyncrl.bench.modes", "tools": "asyncrl.bench.tools"}


def command_scale(options: argparse.Namespace) -> int:
    from asyncrl.rollout.elastic import request_scale
    try:
        path = request_scale(options.run_dir, options.replicas)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}: the run takes {options.replicas} rollout replica(s) at its next weight sync")
    return 0


def command_check_server(options: argparse.Namespace) -> int:
    return check_server_main(options)


def command_bench(options: argparse.Namespace) -> int:
    import importlib
    return importlib.import_module(BENCHMARKS[options.what]).main(options.args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl", description="RL post-training for language models: "
                                     "sync, one-step-off and fully-async PPO/GRPO on Ray.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_commands in (add_demo_command, add_training_commands, add_tool_commands, add_inspection_commands):
        add_commands(commands)
    return parser


def add_demo_command(commands: argparse._SubParsersAction) -> None:
    tasks = "\n".join(textwrap.fill(f"{name}: {task.summary}", 100, initial_indent="  ", subsequent_indent="    ")
                      for name, task in DEMO_TASKS.items())
    demo = commands.add_parser("demo", help="the main job: make a task, build a tiny model, warm-start it with "
                               "SFT, train it with RL, report validation accuracy",
                               description=f"Demo tasks (--task):\n{tasks}",
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--out", default="outputs/demo", help="output folder (default outputs/demo): the run goes "
                      "to OUT/TASK-MODE/ (OUT/TASK-MODE-lora/ with model.lora_rank), the cached data and "
                      "warm-started model to OUT/setup/TASK/")
    demo.add_argument("--task", choices=list(DEMO_TASKS), default=DEFAULT_TASK,
                      help=f"the demo task (default {DEFAULT_TASK}; each is described above)")
    demo.add_argument("--mode", choices=["sync", "one_step_off", "fully_async"], default=DEFAULT_MODE,
                      help=f"trainer.mode (default {DEFAULT_MODE})")
    demo.add_argument("--model-family", choices=list(FAMILIES), default="qwen2",
                      help="the tiny model's family (default qwen2); qwen3_moe and mixtral are mixture-of-experts "
                           "models with 4 experts, 2 per token (docs/moe.md); setup in OUT/setup/TASK-FAMILY/")
    demo.add_argument("--setup-only", action="store_true", help="only make (or reuse) the data and the "
                      "warm-started model, and print where they are: the starting point of your own job")
    demo.add_argument("--rebuild-setup", action="store_true", help="make the data and the warm-started model "
                      "again instead of reusing them")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides of the RL run")
    demo.set_defaults(run=command_demo)


def add_training_commands(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train with CONFIG.yaml plus key=value overrides")
    train.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value]")
    train.set_defaults(run=command_train)

    sft = commands.add_parser("sft", help="supervised warm start on a dataset's reference answers")
    sft.add_argument("--model", required=True, help="HF model folder to start from")
    sft.add_argument("--data", required=True, nargs="+", help="prompt files with reference answers")
    sft.add_argument("--out", required=True, help="output HF folder")
    sft.add_argument("--epochs", type=float, default=1.0)
    sft.add_argument("--batch-size", type=int, default=64)
    sft.add_argument("--lr", type=float, default=3e-3)
    sft.add_argument("--seed", type=int, default=0)
    sft.add_argument("--device", default="cpu", help="cpu, or cuda: fp32 masters with bf16 compute")
    sft.set_defaults(run=command_sft)


def add_tool_commands(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="benchmarks: engine, trainer, sync (weight sync), modes, tools "
                                "(the python tool's sandbox)",
                                description="Each benchmark has its own flags (asyncrl bench engine --help). Results "
                                "go under outputs/bench/ in the current directory unless --output or --results-dir "
                                "says otherwise.")
    bench.add_argument("what", choices=sorted(BENCHMARKS))
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    bench.set_defaults(run=command_bench)

    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server over the engine (docs/serving.md)")
    add_serve_arguments(serve)
    serve.set_defaults(run=command_serve)

    check = commands.add_parser("check-server", help="is an OpenAI-compatible server ready for RL rollouts? named "
                                "checks with their evidence (docs/external-servers.md)")
    add_check_arguments(check)
    check.set_defaults(run=command_check_server)


def add_inspection_commands(commands: argparse._SubParsersAction) -> None:
    config = commands.add_parser("config", help="inspect configs")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    show = config_commands.add_parser("show", help="print the resolved config of [CONFIG.yaml] [key=value ...]")
    show.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value]")
    show.set_defaults(run=command_config_show)
    docs = config_commands.add_parser("docs", help="write docs/configuration.md from the config dataclasses")
    docs.add_argument("--out", default=None, help="output file (default docs/configuration.md)")
    docs.add_argument("--check", action="store_true", help="only check: exit 1 when the file is stale")
    docs.set_defaults(run=command_config_docs)

    advise = commands.add_parser("advise", help="recommend a rollout:trainer device split, sync interval and "
                                 "staleness from a finished run's metrics")
    advise.add_argument("run_dir", help="a run's trainer.output_dir")
    advise.set_defaults(run=command_advise)

    scale = commands.add_parser("scale", help="grow or shrink the rollout replicas of a running one_step_off or "
                                "fully_async run (applied at its next weight sync)")
    scale.add_argument("run_dir", help="the run's trainer.output_dir")
    scale.add_argument("--replicas", type=int, required=True, help="the number of rollout replicas wanted")
    scale.set_defaults(run=command_scale)

    data = commands.add_parser("data", help="datasets")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    make = data_commands.add_parser("make", help="write a built-in task as train.parquet and val.parquet",
                                    description="Tasks and their knobs: " + "; ".join(
                                        f"{name} ({', '.join(field.name for field in dataclasses.fields(task))})"
                                        for name, task in TASKS.items()))
    make.add_argument("task", nargs="?", default=None, help=f"{', '.join(TASKS)} (default: the demo's task, "
                      "arithmetic with the demo's knobs, which the warm-started model of asyncrl demo matches)")
    make.add_argument("--out", required=True, help="output folder")
    make.add_argument("--train-size", type=int, default=4000)
    make.add_argument("--val-size", type=int, default=200)
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="task difficulty knob")
    make.set_defaults(run=command_data_make)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="[%(levelname)s] %(name)s: %(message)s")
    logging.getLogger("asyncrl").setLevel(logging.INFO)
    options = build_parser().parse_args(argv)
    try:
        return options.run(options)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        if type(error).__name__ not in RUN_FAILURES:
            raise
        # A component failed mid-run: say which, and how to continue; the traceback would only repeat it.
        print(f"error: {error}\n(the run stopped; run the same command again, trainer.resume=auto, to continue "
              f"from the last checkpoint)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
