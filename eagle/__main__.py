"""`python -m eagle COMMAND`: generate and budget in eagle.cli, bench in eagle.bench, prepare, train
and distill in eagle.train; each runs inside the one error boundary (eagle.files.run_guarded)."""
import sys

from .bench import main as bench_main
from .cli import main as cli_main
from .train import main as train_main


def main(argv: list[str]) -> int:
    if argv and argv[0] == "bench":
        return bench_main(argv[1:])
    if argv and argv[0] in ("prepare", "train", "distill"):
        return train_main(argv)
    return cli_main(argv)


sys.exit(main(sys.argv[1:]))
