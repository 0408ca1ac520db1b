"""Every numeric flag of prepare, distill, train and evaluate is range-checked once (eagle.checks.FLAG_RANGES),
before a model loads or anything is written: one `error:` sentence naming the flag, exit code 2."""
import argparse

import pytest

from eagle import cli
from eagle.checks import FLAG_RANGES, check_ranges
from eagle.training.commands import build_parser

# Outputs of each command inside the test's directory, so "nothing written" is one listing of it.
OUTPUTS = {"prepare": ["--features", "{tmp}/f"], "distill": ["--distill-dir", "{tmp}/d"],
           "train": ["--features", "{tmp}/f", "--out", "{tmp}/run", "--final-dir", "{tmp}/final"],
           "evaluate": ["--features", "{tmp}/f", "--head", "{tmp}/h", "--json", "{tmp}/m.json"]}


@pytest.mark.parametrize("argv, words", [
    (["distill", "--conversations", "-5"], "--conversations must be >= 1, got -5"),
    (["distill", "--distill-temperature", "-1"], "--distill-temperature must be in [0, 10], got -1.0"),
    (["distill", "--distill-batch", "0"], "--distill-batch must be >= 1, got 0"),
    (["prepare", "--max-len", "0"], "--max-len must be >= 1, got 0"),
    (["prepare", "--heldout-fraction", "2"], "--heldout-fraction must be in [0, 1], got 2.0"),
    (["prepare", "--heldout-fraction", "-1"], "--heldout-fraction must be in [0, 1], got -1.0"),
    (["prepare", "--heldout-fraction", "nan"], "--heldout-fraction must be in [0, 1], got nan"),
    (["prepare", "--shard-size", "0"], "--shard-size must be >= 1, got 0"),
    (["prepare", "--self-distill", "--distill-max-new-tokens", "0"], "--distill-max-new-tokens must be >= 1"),
    (["train", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["train", "--log-every", "0"], "--log-every must be >= 1, got 0"),
    (["train", "--ttt-steps", "0"], "--ttt-steps must be >= 1, got 0"),
    (["train", "--lr", "inf"], "--lr must be a finite number, got inf"),
    (["train", "--ttt-decay", "1.5"], "--ttt-decay must be in [0, 1], got 1.5"),
    (["evaluate", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["evaluate", "--batch", "-2"], "--batch must be >= 1, got -2"),
    (["evaluate", "--samples", "-1"], "--samples must be >= 0, got -1"),
])
def test_an_out_of_range_flag_is_one_sentence_and_writes_nothing(tmp_path, capsys, argv, words):
    command = [a.replace("{tmp}", str(tmp_path)) for a in [*argv, *OUTPUTS[argv[0]]]]
    # --model names no model: a check that came after the load would fail there, with another sentence
    assert cli.main([*command, "--model", str(tmp_path / "no-model")]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and len(errors) == 1 and words in errors[0], err
    assert list(tmp_path.iterdir()) == []  # no manifest, run.json, lock or log left behind


def _numeric_flags(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """Every int or float option of each subcommand, by dest."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: {a.dest for a in sub._actions if a.type in (int, float)} for name, sub in subparsers.choices.items()}


def test_every_numeric_training_flag_has_a_range():
    # --seed has its own check (check_seed); --first-conversation is bounded by --conversations
    elsewhere = {"seed", "first_conversation"}
    for command, dests in _numeric_flags(build_parser()).items():
        assert dests - elsewhere <= set(FLAG_RANGES), (command, sorted(dests - elsewhere - set(FLAG_RANGES)))


@pytest.mark.parametrize("command", ["prepare", "distill", "train", "evaluate"])
def test_defaults_and_the_edges_of_each_range_pass(command):
    args = build_parser().parse_args([command, *(["--head", "h"] if command == "evaluate" else [])])
    check_ranges(args)  # the defaults
    for dest, (low, high) in FLAG_RANGES.items():
        if getattr(args, dest, None) is not None:
            for edge in (low, high) if high is not None else (low,):
                check_ranges(argparse.Namespace(**{**vars(args), dest: type(getattr(args, dest))(edge)}))
