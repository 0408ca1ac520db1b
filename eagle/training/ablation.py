"""The recipe ablation and data-scaling curve (`python -m eagle ablation`): three recipes trained from
scratch on one feature extraction, with the same held-out set and step budget, at each data fraction.

Recipes (RECIPES):
  eagle1      the EAGLE-1 recipe: an EAGLE-1/2 head, SmoothL1 on features + 0.1 soft CE, one draft step;
  eagle1-ttt  the same head and loss with a training-time test (ttt_steps unrolled, step j weighted decay**j);
  eagle3      EAGLE-3: three target layers fused, its own draft vocabulary (d2t/t2d), token loss, the same test.

Data. --features must be an EAGLE-3 extraction (`prepare --head-type eagle3`): besides the inputs of target
layers 2, L//2 and L-3 it stores the post-norm last hidden states (`target_features`), exactly what an EAGLE-1
prepare stores, and train reads those for an EAGLE-1/2 head (features.load_shards(last_layer_only)); train
refuses an EAGLE-1 extraction for an EAGLE-3 head. So one extraction serves all three recipes. Fraction f
trains on the first ceil(f * N) of the N training samples (shards keep ShareGPT's order: the first
conversations), so the subsets nest; each subset's draft vocabulary and soft-CE rows are counted on that
subset alone (train's `train_samples`). Every point is scored on the whole held-out split of the extraction.

Each point (recipe, fraction): train.train_head into OUT/runs/RECIPE-FRACTION (resuming from its checkpoint),
whose final held-out evaluation gives the top-1 accuracy at each of 4 unrolled draft steps; optionally MT-bench
tau: the first turn of the first `tau_per_category` questions of each category decoded greedily with the
trained head through a tools Session, tau = new tokens / target forwards (eagle.records.stats). After each point
OUT/ablation.json is rewritten atomically; a rerun skips the points it holds (and only adds tau where newly
asked) and refuses settings that differ from the file's, naming the field. One lock per OUT."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.config import DecodeConfig
from ..core.decode import generate
from ..records.files import atomic_write_json, exclusive_lock, read_json_object, run_logger
from ..models.headio import load_head
from ..records.questions import load_questions, select_questions
from ..records.stats import tau
from ..models.precision import dtype_name
from ..models.target import Target
from ..tools.session import Session
from .features import check_features
from .objective import default_loss
from .train import check_more_features, train_head

RESULTS_FILE = "ablation.json"
RECIPE_NAMES = ("eagle1", "eagle1-ttt", "eagle3")
# What every point's weights depend on besides the recipe: a rerun must match each (fractions and recipes
# may grow: their points are keyed by name).
FINGERPRINT = ("steps", "lr", "batch", "warmup", "ttt_steps", "ttt_decay", "draft_vocab_size", "seed")


@dataclass(frozen=True)
class AblationConfig:
    features: str
    out: str
    steps: int = 400
    fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    recipes: tuple[str, ...] = RECIPE_NAMES
    lr: float = 5e-4
    batch: int = 8
    warmup: int = 20
    ttt_steps: int = 2  # draft steps unrolled by the two training-time-test recipes
    ttt_decay: float = 0.8
    draft_vocab_size: int = 8192  # the EAGLE-3 head's own vocabulary (0 = the target's whole vocabulary)
    checkpoint_every: int = 50
    seed: int = 0
    tau_per_category: int = 0  # MT-bench tau per point over this many questions per category (0 = off)
    questions: str = "mt_bench"
    tau_max_new_tokens: int = 64
    tau_tree: tuple[int, int, int] = (60, 6, 10)  # total_tokens, depth, top_k: the paper budget
    # another extraction (e.g. ShareGPT's original replies, every turn): each point is also trained with its whole
    # train split added (train's more_features), named RECIPE-FRACTION+more, on the same held-out set and steps
    more_features: str = ""

    def validate(self) -> "AblationConfig":
        """Raise ValueError with one clear sentence for any out-of-range field."""
        fr = self.fractions
        checks = [
            (self.steps >= 1, f"--steps must be >= 1, got {self.steps}"),
            (len(fr) > 0 and all(0 < f <= 1 for f in fr), f"--fractions must each be in (0, 1], got {list(fr)}"),
            (len(set(fr)) == len(fr), f"--fractions names a fraction twice: {list(fr)}"),
            (len(self.recipes) > 0 and set(self.recipes) <= set(RECIPE_NAMES),
             f"--recipes must be from {', '.join(RECIPE_NAMES)}, got {', '.join(self.recipes) or 'none'}"),
            (len(set(self.recipes)) == len(self.recipes), "--recipes names a recipe twice"),
            (math.isfinite(self.lr) and self.lr > 0, f"--lr must be a finite number > 0, got {self.lr}"),
            (self.batch >= 1 and self.warmup >= 0, "--batch must be >= 1 and --warmup >= 0"),
            (self.ttt_steps >= 2, f"--ttt-steps must be >= 2 (1 is the EAGLE-1 recipe itself), got {self.ttt_steps}"),
            (0 < self.ttt_decay <= 1, f"--ttt-decay must be in (0, 1], got {self.ttt_decay}"),
            (self.draft_vocab_size >= 0, f"--draft-vocab-size must be >= 0, got {self.draft_vocab_size}"),
            (self.checkpoint_every >= 1, f"--checkpoint-every must be >= 1, got {self.checkpoint_every}"),
            (self.tau_per_category >= 0, f"--tau-per-category must be >= 0, got {self.tau_per_category}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self.tau_decode().validate()  # the tree and reply length, in DecodeConfig's own words
        return self

    def tau_decode(self) -> DecodeConfig:
        total, depth, top_k = self.tau_tree
        # the head's own tree, no prompt-lookup branch: the ablation compares heads
        return DecodeConfig(mode="dynamic", max_new_tokens=self.tau_max_new_tokens, total_tokens=total,
                            depth=depth, top_k=top_k, lookup_tokens=0)

    def recipe(self, name: str) -> dict:
        """train_head's recipe overrides for one recipe."""
        ttt = dict(ttt_steps=self.ttt_steps, ttt_decay=self.ttt_decay)
        return {"eagle1": dict(head_type="eagle1", ttt_steps=1, loss=default_loss("eagle1")),
                "eagle1-ttt": dict(head_type="eagle1", loss=default_loss("eagle1"), **ttt),
                "eagle3": dict(head_type="eagle3", loss=default_loss("eagle3"),
                               draft_vocab_size=self.draft_vocab_size, **ttt)}[name]

    def tau_settings(self) -> dict | None:
        if not self.tau_per_category:
            return None
        return {"questions": self.questions, "per_category": self.tau_per_category,
                "decode": asdict(self.tau_decode())}


def parse_fractions(text: str) -> tuple[float, ...]:
    """'0.25,0.5,1' -> (0.25, 0.5, 1.0); one sentence for a word that is not a number."""
    try:
        return tuple(float(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise ValueError(f"--fractions {text!r}: give numbers in (0, 1] separated by commas, e.g. 0.25,0.5,1") from None


def parse_tree(text: str) -> tuple[int, int, int]:
    """'60/6/10' -> (60, 6, 10): total_tokens/depth/top_k."""
    parts = text.split("/")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--tau-tree {text!r}: give TOTAL/DEPTH/TOP_K as three whole numbers, e.g. 60/6/10")
    total, depth, top_k = (int(p) for p in parts)
    return total, depth, top_k


def point_name(recipe: str, fraction: float, more: bool = False) -> str:
    return f"{recipe}-{fraction:g}" + ("+more" if more else "")


def check_ablation_features(features_dir: Path) -> dict:
    """The extraction every recipe reads: finished, and made for an EAGLE-3 head. Returns its manifest."""
    manifest = check_features(features_dir)
    if manifest is None or manifest.get("head_type", "eagle1") != "eagle3":
        raise ValueError(f"--features {features_dir} is not an EAGLE-3 extraction, which the eagle3 recipe needs "
                         "(and which holds the EAGLE-1 features too): prepare it with --head-type eagle3.")
    return manifest


def _fingerprint(target: Target, cfg: AblationConfig, manifest: dict, more: dict | None = None) -> dict:
    extra = {} if more is None else {"more_features": str(Path(cfg.more_features).resolve()),
                                     "more_features_sha256": more.get("samples_sha256")}
    return {"model": target.name, "dtype": dtype_name(target.dtype), "features": str(Path(cfg.features).resolve()),
            "features_sha256": manifest.get("samples_sha256"), **{k: getattr(cfg, k) for k in FINGERPRINT}, **extra}


MOVABLE = ("features", "more_features")  # paths: the checksums say which data, and a clone or machine moves them


def _load_results(path: Path, settings: dict, tau_settings: dict | None) -> dict:
    """The results so far (a fresh record when there are none); one sentence when they were made otherwise."""
    if not path.exists():
        return {"settings": settings, "tau_settings": tau_settings, "points": {}}
    old = read_json_object(path, fix=": delete it or use another --out")
    for k, v in settings.items():
        was = old.get("settings", {}).get(k)
        # a results file made without --more-features takes them on: its points did not read them
        if k not in MOVABLE and was != v and not (k == "more_features_sha256" and was is None):
            raise ValueError(f"{path} holds an ablation run with {k}={was!r} (this run: "
                             f"{v!r}): rerun with the same value or use another --out.")
    was = old.get("tau_settings")
    if tau_settings and was and was != tau_settings:
        raise ValueError(f"{path} holds MT-bench tau measured with other settings ({was}): rerun with the same "
                         "--tau-* flags or use another --out.")
    carried = (*MOVABLE, "more_features_sha256")  # this run's paths, and the checksum a file without one takes on
    return {**old, "settings": {**old["settings"], **{k: settings[k] for k in carried if k in settings}},
            "tau_settings": tau_settings or was}


def run_ablation(target: Target, cfg: AblationConfig, progress: bool = True) -> dict:
    """Every point of the grid not yet in OUT/ablation.json, in order (fraction, then recipe); returns the
    results, which are on disk after each point."""
    cfg.validate()
    manifest = check_ablation_features(Path(cfg.features))
    more = check_more_features(manifest, Path(cfg.more_features)) if cfg.more_features else None
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out / ".lock", f"ablation --out {out}"):
        results = _load_results(out / RESULTS_FILE, _fingerprint(target, cfg, manifest, more), cfg.tau_settings())
        n_train = int(manifest["stats"]["train_samples"])
        results.update(train_samples_total=n_train, heldout_samples=int(manifest["stats"]["heldout_samples"]))
        return _run_points(target, cfg, results, n_train, progress)


def _run_points(target: Target, cfg: AblationConfig, results: dict, n_train: int, progress: bool) -> dict:
    out = Path(cfg.out)
    log = run_logger("ablation", out / "ablation.log")
    datas = (False, True) if cfg.more_features else (False,)  # without, then with the more features
    grid = [(r, f, m) for f in sorted(cfg.fractions) for r in cfg.recipes for m in datas]
    bar = tqdm(grid, desc="ablation", unit="point", disable=not progress)
    for recipe, fraction, more in bar:
        name = point_name(recipe, fraction, more)
        bar.set_postfix_str(name)
        point = results["points"].get(name)
        if point is None:
            point = _train_point(target, cfg, recipe, fraction, n_train, progress, more)
            results["points"][name] = point
            atomic_write_json(out / RESULTS_FILE, results)
            log.info("%s: held-out accuracy per step %s", name, _accs(point))
        if cfg.tau_per_category and "tau" not in point:
            log.info("%s: MT-bench tau (%d question(s) per category, %d new tokens each)", name,
                     cfg.tau_per_category, cfg.tau_max_new_tokens)
            point["tau"] = _point_tau(target, out / "runs" / name / "head", cfg)
            atomic_write_json(out / RESULTS_FILE, results)
            log.info("%s: MT-bench tau %.3f", name, point["tau"]["tau"])
    atomic_write_json(out / RESULTS_FILE, results)  # also when every point was there: the totals are current
    return results


def _accs(point: dict) -> str:
    return " ".join(f"{point['heldout'][k]:.3f}" for k in sorted(point["heldout"]) if k.startswith("acc_step"))


def _train_point(target: Target, cfg: AblationConfig, recipe: str, fraction: float, n_train: int,
                 progress: bool, more: bool = False) -> dict:
    """Train (or resume, or only re-evaluate a finished run) one point; its record for the results
    (train_samples: of --features; more_samples: of --more-features, only in a +more point)."""
    n = max(1, math.ceil(fraction * n_train))
    summary = train_head(target, cfg.features, Path(cfg.out) / "runs" / point_name(recipe, fraction, more), cfg.steps,
                         cfg.lr, cfg.batch, progress=progress, warmup=cfg.warmup, eval_every=0,
                         checkpoint_every=cfg.checkpoint_every, seed=cfg.seed, train_samples=n,
                         more_features=cfg.more_features if more else "", **cfg.recipe(recipe))
    extra = {"more_samples": summary["train_samples"] - n} if more else {}
    return {"recipe": recipe, "fraction": fraction, "train_samples": n, **extra,
            "train_tokens": summary["train_tokens"],
            "steps": summary["steps"], "resumed_from": summary["start_step"], "wall_s": summary["wall_s"],
            "heldout": summary["heldout"]}


def _point_tau(target: Target, head_dir: Path, cfg: AblationConfig) -> dict:
    """MT-bench tau of one trained head: each selected question's first turn, greedy, through a Session (the
    path every front end decodes through), totals by eagle.records.stats.tau."""
    questions, _ = load_questions(cfg.questions)
    chosen = select_questions(questions, per_category=cfg.tau_per_category)
    session = Session.of(target, load_head(head_dir, target), str(head_dir))
    tokens = forwards = 0
    with torch.no_grad():
        for q in chosen:
            prepared = session.prepare(q.turns[0], cfg.tau_decode())
            g = generate(prepared.decoder, prepared.ids)
            tokens, forwards = tokens + len(g.tokens), forwards + g.target_forwards
    return {"tau": tau(tokens, forwards), "questions": len(chosen), "new_tokens": tokens, "target_forwards": forwards}
