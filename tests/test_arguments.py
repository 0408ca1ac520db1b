"""Every numeric flag of prepare, distill, train and evaluate is range-checked once (eagle.tools.checks.FLAG_RANGES),
before a model loads or anything is written: one `error:` sentence naming the flag, exit code 2."""
import argparse

import pytest

from eagle import cli
from eagle.tools.checks import FLAG_RANGES, check_ranges
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


# ---- every flag of every command, and every notebook keyword, with a bad value of each kind ----------
# (command, kind, the flags of the case, words of the one error line). kind: "type" (not a value of the
# flag's type, choices or kind of path), "range" (the right type, out of range), "combination" (a
# value fine alone that cannot run with another flag). {tmp} is the test's directory; {file} a file in it,
# {feat} a features directory train accepts, {head} a directory holding a config.json.
DECODE_CASES = [  # generate's decode flags, shared by profile and bench (one DecodeSettings.validate)
    ("type", ["--model", "{tmp}/no-model"], "No model directory at"),
    ("type", ["--head", "{tmp}/nohead"], "No draft head at"),
    ("type", ["--device", "tpu"], "--device: unknown device 'tpu'"),
    ("type", ["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    ("type", ["--head-dtype", "fp8"], "argument --head-dtype: invalid choice: 'fp8'"),
    ("type", ["--threads", "two"], "argument --threads: invalid int value"),
    ("range", ["--threads", "0"], "--threads must be >= 1, got 0"),
    ("type", ["--preset", "turbo"], "argument --preset: invalid choice: 'turbo'"),
    ("type", ["--max-new-tokens", "8.5"], "argument --max-new-tokens: invalid int value: '8.5'"),
    ("range", ["--max-new-tokens", "0"], "--max-new-tokens must be in 1..100000, got 0"),
    ("type", ["--temperature", "hot"], "argument --temperature: invalid float value: 'hot'"),
    ("range", ["--temperature", "-1"], "--temperature must be in [0, 10], got -1.0"),
    ("range", ["--temperature", "nan"], "--temperature must be in [0, 10], got nan"),
    ("type", ["--top-p", "most"], "argument --top-p: invalid float value"),
    ("range", ["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    ("type", ["--top-k-sampling", "1.5"], "argument --top-k-sampling: invalid int value"),
    ("range", ["--top-k-sampling", "-1"], "--top-k-sampling must be >= 0, got -1"),
    ("type", ["--seed", "x"], "argument --seed: invalid int value"),
    ("range", ["--seed", "-1"], "--seed must be an integer from 0 to 2**63 - 1, got -1"),
    ("type", ["--total-tokens", "4.5"], "argument --total-tokens: invalid int value"),
    ("range", ["--total-tokens", "0"], "--total-tokens must be in 1..1024, got 0"),
    ("type", ["--depth", "deep"], "argument --depth: invalid int value"),
    ("range", ["--depth", "33"], "--depth must be in 0..32, got 33"),
    ("type", ["--top-k", "x"], "argument --top-k: invalid int value"),
    ("range", ["--top-k", "0"], "--top-k must be in 1..64, got 0"),
    ("type", ["--draft-vocab", "x"], "argument --draft-vocab: invalid int value"),
    ("range", ["--draft-vocab", "-1"], "--draft-vocab must be >= 0, got -1"),
    ("type", ["--lookup-tokens", "x"], "argument --lookup-tokens: invalid int value"),
    ("range", ["--lookup-tokens", "65"], "--lookup-tokens must be in -1..64, got 65"),
    ("range", ["--lookup-tokens", "4", "--temperature", "0.5"], "--lookup-tokens 4 needs greedy dynamic decoding"),
    ("type", ["--budget", "huge"], "argument --budget: invalid choice: 'huge'"),
]
MODEL_CASES = [c for c in DECODE_CASES if c[1][0] in ("--model", "--head", "--device", "--dtype", "--head-dtype",
                                                                 "--threads")]
TRAINING_COMMON = [  # every training command's model flags and --seed
    ("type", ["--model", "{tmp}/no-model"], "No model directory at"),
    ("type", ["--device", "tpu"], "--device: unknown device 'tpu'"),
    ("type", ["--dtype", "fp8"], "argument --dtype: invalid choice"),
    ("type", ["--threads", "x"], "argument --threads: invalid int value"),
    ("range", ["--threads", "0"], "--threads must be >= 1, got 0"),
    ("type", ["--seed", "x"], "argument --seed: invalid int value"),
    ("range", ["--seed", "-1"], "--seed must be an integer from 0 to 2**63 - 1"),
]
DISTILL_FLAGS = [
    ("type", ["--distill-dir", "{file}"], "--distill-dir {file} is a file, not a directory"),
    ("type", ["--distill-max-new-tokens", "x"], "argument --distill-max-new-tokens: invalid int value"),
    ("range", ["--distill-max-new-tokens", "0"], "--distill-max-new-tokens must be >= 1, got 0"),
    ("type", ["--distill-max-prompt-tokens", "x"], "argument --distill-max-prompt-tokens: invalid int value"),
    ("range", ["--distill-max-prompt-tokens", "0"], "--distill-max-prompt-tokens must be >= 1, got 0"),
    ("type", ["--distill-batch", "x"], "argument --distill-batch: invalid int value"),
    ("range", ["--distill-batch", "0"], "--distill-batch must be >= 1, got 0"),
    ("type", ["--distill-temperature", "x"], "argument --distill-temperature: invalid float value"),
    ("range", ["--distill-temperature", "-1"], "--distill-temperature must be in [0, 10], got -1.0"),
    ("type", ["--sharegpt", "{tmp}/none.json"], "--sharegpt {tmp}/none.json: no such file"),
]
HEAD_FLAGS = [("type", ["--head-type", "eagle9"], "argument --head-type: invalid choice")]
BASE = {  # each command's required flags, outputs inside {tmp}
    "generate": ["generate", "--prompt", "x"], "budget": ["budget"], "profile": ["profile"],
    "export-token-map": ["export-token-map", "--k", "5", "--out", "{tmp}/map.pt"],
    "export-head": ["export-head", "--head", "auto", "--format", "eagle", "--out", "{tmp}/eh"],
    "bench": ["bench", "--dataset", "mt_bench", "--out", "{tmp}/bench"],
    "prepare": ["prepare", "--features", "{tmp}/f"], "distill": ["distill", "--distill-dir", "{tmp}/d"],
    "train": ["train", "--features", "{feat}", "--out", "{tmp}/run"],
    "evaluate": ["evaluate", "--features", "{feat}", "--head", "{head}"],
    "analysis figures": ["figures", "--traces", "{file}", "--out", "{tmp}/fig"],
}
CASES: dict[str, list[tuple[str, list[str], str]]] = {
    "generate": DECODE_CASES + [
        ("range", ["--prompt", " "], "The prompt is empty"),
        ("type", ["--mode", "fast"], "argument --mode: invalid choice: 'fast'"),
        ("type", ["--trace", "{tmp}"], "--trace {tmp} is a directory: give a file name"),
        ("type", ["--json=yes"], "argument --json: ignored explicit argument 'yes'"),
        ("combination", ["--mode", "vanilla", "--budget", "auto"], "--budget auto sizes dynamic trees only, but "
                                                                    "--mode is vanilla"),
        ("combination", ["--mode", "static", "--budget", "adaptive"], "--budget adaptive sizes dynamic trees only")],
    "budget": MODEL_CASES + [("type", ["--refresh=1"], "argument --refresh: ignored explicit argument"),
                             ("type", ["--json=1"], "argument --json: ignored explicit argument")],
    "profile": DECODE_CASES + [
        ("type", ["--mode", "vanilla"], "argument --mode: invalid choice: 'vanilla'"),
        ("type", ["--prompts", "x"], "argument --prompts: invalid int value"),
        ("range", ["--prompts", "0"], "--prompts must be >= 1, got 0"),
        ("type", ["--no-tiny=1"], "argument --no-tiny: ignored explicit argument"),
        ("combination", ["--json", "{file}"], "--json {file} exists: give a new file name, or --force"),
        ("type", ["--force=1"], "argument --force: ignored explicit argument"),
        ("combination", ["--preset", "vanilla"], "--preset vanilla: profile times the phases of a draft tree")],
    "export-token-map": [
        ("type", ["--k", "x"], "argument --k: invalid int value"), ("range", ["--k", "0"], "--k must be >= 1, got 0"),
        ("type", ["--out", "{tmp}"], "--out {tmp} is a directory: give a file name"),
        ("combination", ["--out", "{file}"], "--out {file} exists; pass --force to replace it"),
        ("type", ["--head", "{tmp}/nohead"], "No draft head at {tmp}/nohead"),
        ("type", ["--model", "{tmp}/no-model"], "--head auto: no trained head ships for {tmp}/no-model"),
        ("type", ["--force=1"], "argument --force: ignored explicit argument")],
    "export-head": [
        ("type", ["--head", "{tmp}/nohead"], "No draft head at {tmp}/nohead"),
        ("type", ["--format", "onnx"], "argument --format: invalid choice: 'onnx'"),
        ("type", ["--out", "{file}"], "--out {file} is a file, not a directory"),
        ("type", ["--overwrite=1"], "argument --overwrite: ignored explicit argument"),
        ("type", ["--model", "{tmp}/no-model"], "--head auto: no trained head ships for {tmp}/no-model")],
    "bench": DECODE_CASES + [
        ("type", ["--dataset", "{tmp}/none.jsonl"], "No dataset '{tmp}/none.jsonl'"),
        ("type", ["--modes", "turbo"], "unknown mode 'turbo'"),
        ("combination", ["--modes", "vanilla,vanilla"], "--modes needs at least one mode and no repeats"),
        ("type", ["--baselines", "slowest"], "argument --baselines: invalid choice"),
        ("type", ["--limit", "x"], "argument --limit: invalid int value"),
        ("range", ["--limit", "0"], "--limit must be >= 1, got 0"),
        ("type", ["--per-category", "x"], "argument --per-category: invalid int value"),
        ("range", ["--per-category", "-1"], "--per-category must be >= 1, got -1"),
        ("type", ["--turns", "3"], "argument --turns: invalid choice: 3"),
        ("type", ["--out", "{file}"], "--out {file} is a file, not a directory"),
        ("type", ["--json=1"], "argument --json: ignored explicit argument"),
        ("type", ["--overwrite=1"], "argument --overwrite: ignored explicit argument"),
        ("type", ["--export", "csv"], "argument --export: invalid choice: 'csv'"),
        ("combination", ["--budget", "adaptive"], "bench --budget adaptive: name the mode dynamic:adaptive"),
        ("combination", ["--modes", "vanilla", "--budget", "auto"], "--budget auto sizes dynamic trees, but --modes "
                                                                      "has no dynamic mode")],
    "prepare": TRAINING_COMMON + DISTILL_FLAGS + HEAD_FLAGS + [
        ("type", ["--features", "{file}"], "--features {file} is a file, not a directory"),
        ("type", ["--conversations", "x"], "argument --conversations: invalid int value"),
        ("range", ["--conversations", "0"], "--conversations must be >= 1, got 0"),
        ("type", ["--first-conversation", "x"], "argument --first-conversation: invalid int value"),
        ("range", ["--first-conversation", "-1"], "--first-conversation -1: must be at least 0"),
        ("combination", ["--first-conversation", "900", "--conversations", "800"], "--first-conversation 900: must "
                                                                                   "be at least 0 and below"),
        ("type", ["--max-len", "x"], "argument --max-len: invalid int value"),
        ("range", ["--max-len", "0"], "--max-len must be >= 1, got 0"),
        ("type", ["--heldout-fraction", "x"], "argument --heldout-fraction: invalid float value"),
        ("range", ["--heldout-fraction", "2"], "--heldout-fraction must be in [0, 1], got 2.0"),
        ("type", ["--shard-size", "x"], "argument --shard-size: invalid int value"),
        ("range", ["--shard-size", "0"], "--shard-size must be >= 1, got 0"),
        ("type", ["--self-distill=1"], "argument --self-distill: ignored explicit argument")],
    "distill": TRAINING_COMMON + DISTILL_FLAGS + [
        ("type", ["--conversations", "x"], "argument --conversations: invalid int value"),
        ("range", ["--conversations", "-5"], "--conversations must be >= 1, got -5")],
    "train": TRAINING_COMMON + HEAD_FLAGS + [
        ("type", ["--features", "{tmp}/nofeat"], "No train-*.safetensors shards in {tmp}/nofeat"),
        ("type", ["--out", "{file}"], "--out {file} is a file, not a directory"),
        ("type", ["--final-dir", "{file}"], "--final-dir {file} is a file, not a directory"),
        ("combination", ["--final-dir", "{head}"], "--final-dir {head} already holds a head: pass --overwrite"),
        ("type", ["--overwrite=1"], "argument --overwrite: ignored explicit argument"),
        ("type", ["--init", "{tmp}/nohead"], "--init {tmp}/nohead: no head there"),
        ("type", ["--more-features", "{tmp}/nomore"], "No train-*.safetensors shards in {tmp}/nomore"),
        ("combination", ["--more-features", "{feat}"], "--more-features {feat}: both extractions need a manifest.json"),
        ("type", ["--loss", "l2"], "argument --loss: invalid choice"),
        *[(kind, [flag, value], words) for flag, low in [
            ("--steps", "-1"), ("--lr", "-1"), ("--batch", "0"), ("--warmup", "-1"), ("--noise", "-1"),
            ("--vocab-k", "-1"), ("--checkpoint-every", "-1"), ("--eval-every", "-1"), ("--eval-samples", "0"),
            ("--log-every", "0"), ("--max-minutes", "-1"), ("--ttt-steps", "0"), ("--ttt-decay", "1.5"),
            ("--draft-vocab-size", "-1")]
          for kind, value, words in [("type", "x", f"argument {flag}: invalid"), ("range", low, f"{flag} must be")]]],
    "evaluate": TRAINING_COMMON + HEAD_FLAGS + [
        ("type", ["--features", "{tmp}/nofeat"], "No train-*.safetensors shards in {tmp}/nofeat"),
        ("type", ["--head", "{tmp}/nohead"], "--head {tmp}/nohead: no head there"),
        ("type", ["--batch", "x"], "argument --batch: invalid int value"),
        ("range", ["--batch", "-2"], "--batch must be >= 1, got -2"),
        ("type", ["--vocab-k", "x"], "argument --vocab-k: invalid int value"),
        ("range", ["--vocab-k", "-1"], "--vocab-k must be >= 0, got -1"),
        ("type", ["--samples", "x"], "argument --samples: invalid int value"),
        ("range", ["--samples", "-1"], "--samples must be >= 0, got -1"),
        ("type", ["--json", "{tmp}"], "--json {tmp} is a directory: give a file name"),
        ("combination", ["--json", "{file}"], "--json {file} already exists")],
    "analysis figures": [
        ("type", ["--traces", "{tmp}/none"], "no trace file or directory at {tmp}/none"),
        ("type", ["--out", "{file}"], "--out {file} is a file, not a directory"),
        ("type", ["--bins", "x"], "argument --bins: invalid int value"),
        ("range", ["--bins", "0"], "--bins must be >= 1, got 0"),
        ("type", ["--formats", "gif"], "--formats 'gif': choose from png"),
        ("type", ["--scale", "big"], "argument --scale: invalid float value"),
        ("range", ["--scale", "0"], "--scale must be in [0.1, 10], got 0.0")],
}
# Flags no value of is bad: --verifier is a name export-head records as given.
FREE_TEXT = {("export-head", "--verifier")}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    import analysis.__main__ as analysis_main
    from eagle.tools.bench.command import build_parser as bench_parser

    def subcommands(parser):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    found = {**subcommands(cli.build_parser()), **subcommands(build_parser()), "bench": bench_parser(),
             "analysis figures": subcommands(analysis_main._parser())["figures"]}
    return {name: p for name, p in found.items() if name in BASE}


def _fill(argv: list[str], tmp) -> list[str]:
    paths = {"{file}": tmp / "file", "{feat}": tmp / "feat", "{head}": tmp / "head", "{tmp}": tmp}
    out = []
    for arg in argv:
        for key, path in paths.items():
            arg = arg.replace(key, str(path))
        out.append(arg)
    return out


def _run(command: str, argv: list[str]) -> int:
    if command == "analysis figures":
        import analysis.__main__ as analysis_main
        return analysis_main.main(argv)
    return cli.main(argv)


@pytest.mark.parametrize("command, kind, flags, words", [
    (command, kind, flags, words) for command, cases in CASES.items() for kind, flags, words in cases],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_every_flag_with_a_bad_value_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, command, kind, flags,
                                                                          words):
    (tmp_path / "file").write_text("x")
    (tmp_path / "feat").mkdir()
    (tmp_path / "feat" / "train-00000.safetensors").write_bytes(b"")  # enough for train's pre-load check
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "config.json").write_text("{}")
    before = sorted(tmp_path.rglob("*"))
    argv = _fill([*BASE[command], *flags], tmp_path)
    if "--model" not in flags and any(a.option_strings == ["--model"] for a in _parsers()[command]._actions):
        argv += ["--model", str(tmp_path / "no-model")]  # a check after the model loads would fail there instead
    assert _run(command, argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert _fill([words], tmp_path)[0] in err, err
    assert sorted(tmp_path.rglob("*")) == before  # no manifest, run.json, lock, log or output


def test_the_table_covers_every_flag_of_every_command():
    """Every option has a bad-value case; every numeric one a wrong-type and an out-of-range case."""
    for command, parser in _parsers().items():
        cases = CASES[command]
        given = {(kind, f) for kind, flags, _ in cases for f in flags if f.startswith("--")}
        flags = {f.split("=")[0] for _, f in given}
        for action in parser._actions:
            flag = next((s for s in action.option_strings if s.startswith("--")), None)
            if flag in (None, "--help") or (command, flag) in FREE_TEXT:
                continue
            assert flag in flags, (command, flag)
            if action.type in (int, float) and action.choices is None:
                assert {("type", flag), ("range", flag)} <= given, (command, flag)


NOTEBOOK_CASES = [  # (prompt, keywords, words of the SettingError)
    (None, {}, "prompt must be a string, got None"), (123, {}, "prompt must be a string, got 123"),
    (" ", {}, "The prompt is empty"),
    ("hi", {"max_tokens": 8}, "unknown setting max_tokens"),
    ("hi", {"mode": "fast"}, "mode must be one of vanilla, static, dynamic, got 'fast'"),
    ("hi", {"mode": 1}, "mode must be a string, got 1"),
    ("hi", {"preset": "turbo"}, "preset must be one of cpu, paper, vanilla, got 'turbo'"),
    ("hi", {"max_new_tokens": "8"}, "max_new_tokens must be an integer, got '8' (str)"),
    ("hi", {"max_new_tokens": 8.5}, "max_new_tokens must be an integer, got 8.5"),
    ("hi", {"max_new_tokens": True}, "max_new_tokens must be an integer, got True"),
    ("hi", {"max_new_tokens": 0}, "max_new_tokens must be in 1..100000, got 0"),
    ("hi", {"temperature": "hot"}, "temperature must be a number, got 'hot'"),
    ("hi", {"temperature": -1}, "temperature must be in [0, 10], got -1"),
    ("hi", {"top_p": None}, "top_p must be a number, got None"),
    ("hi", {"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ("hi", {"top_k_sampling": "all"}, "top_k_sampling must be an integer"),
    ("hi", {"top_k_sampling": -1}, "top_k_sampling must be >= 0, got -1"),
    ("hi", {"seed": 1.0}, "seed must be an integer, got 1.0"),
    ("hi", {"seed": -1}, "seed must be an integer from 0 to 2**63 - 1, got -1"),
    ("hi", {"total_tokens": 4.5}, "total_tokens must be an integer, got 4.5"),
    ("hi", {"total_tokens": 0}, "total_tokens must be in 1..1024, got 0"),
    ("hi", {"depth": "6"}, "depth must be an integer"), ("hi", {"depth": 33}, "depth must be in 0..32, got 33"),
    ("hi", {"top_k": [4]}, "top_k must be an integer"), ("hi", {"top_k": 65}, "top_k must be in 1..64, got 65"),
    ("hi", {"draft_vocab": 1e3}, "draft_vocab must be an integer"),
    ("hi", {"draft_vocab": -1}, "draft_vocab must be >= 0, got -1"),
    ("hi", {"lookup_tokens": 2.0}, "lookup_tokens must be an integer"),
    ("hi", {"lookup_tokens": 3, "temperature": 0.7}, "lookup_tokens 3 needs greedy dynamic decoding"),
    ("hi", {"budget": "huge"}, "budget must be one of fixed, auto, adaptive, got 'huge'"),
    ("hi", {"budget": True}, "budget must be a string, got True"),
    ("hi", {"mode": "vanilla", "budget": "auto"}, "budget auto sizes dynamic trees only, but mode is vanilla"),
    ("hi", {"model": 7}, "model must be a string, got 7"),
    ("hi", {"model": "./no-such-model"}, "model='./no-such-model': No model directory at"),
    ("hi", {"head": None}, "head must be a string, got None"),
    ("hi", {"head": "./no-such-head"}, "head='./no-such-head': No draft head at ./no-such-head"),
    ("hi", {"device": 0}, "device must be a string, got 0"),
    ("hi", {"device": "tpu"}, "device: unknown device 'tpu'"),
    ("hi", {"dtype": "fp8"}, "dtype must be one of auto, float32, bfloat16, float16, got 'fp8'"),
    ("hi", {"head_dtype": "fp8"}, "head_dtype must be one of auto, target, float32, bfloat16, float16, int8, got 'fp8'"),
    ("hi", {"threads": "2"}, "threads must be an integer"), ("hi", {"threads": 0}, "threads must be >= 1, got 0"),
]


@pytest.mark.parametrize("prompt, keywords, words", NOTEBOOK_CASES, ids=repr)
def test_every_notebook_keyword_with_a_bad_value_is_our_one_exception(prompt, keywords, words):
    import eagle
    from eagle.notebook import Explorer
    with pytest.raises(eagle.SettingError) as caught:
        Explorer().explore(prompt, **keywords)
    assert isinstance(caught.value, ValueError) and words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_notebook_table_covers_every_keyword():
    from eagle.tools.loading import FLOAT_SETTINGS, INT_SETTINGS, DecodeSettings
    bad = {k: [kw[k] for _, kw, _ in NOTEBOOK_CASES if k in kw] for k in DecodeSettings.names()}
    for name, values in bad.items():
        assert values, name
        if name in INT_SETTINGS or name in FLOAT_SETTINGS:  # a wrong type and an out-of-range number
            assert any(not isinstance(v, (int, float)) or isinstance(v, bool) or (name in INT_SETTINGS and
                                                                                   isinstance(v, float))
                       for v in values) and any(isinstance(v, (int, float)) for v in values), name


def test_cli_and_notebook_share_one_validation():
    """The same bad value gives the same sentence, spelled as a flag or as a keyword."""
    from eagle.core.config import SettingError
    from eagle.tools.loading import DecodeSettings, flag_name
    args = cli.build_parser().parse_args(["generate", "--prompt", "x", "--total-tokens", "0"])
    with pytest.raises(SettingError) as from_flags:
        DecodeSettings.from_args(args).validate(flag_name)
    with pytest.raises(SettingError) as from_keywords:
        DecodeSettings.from_keywords({"total_tokens": 0}).validate()
    assert str(from_flags.value) == "--" + str(from_keywords.value).replace("total_tokens", "total-tokens")
