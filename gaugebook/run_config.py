"""What defines one training run of the experiment: :class:`RunConfig`, and which runs can be
trained together as one batched model (:func:`batch_key`)."""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import string
from dataclasses import dataclass, field

from gaugebook.checks import dataclass_from_dict
from gaugebook.data import MIN_PROBE_CONTEXT
from gaugebook.gpt import GPTConfig
from gaugebook.optim import OPTIMIZERS, PROJECTIONS

__all__ = ["RunConfig", "SYMMETRIES", "PARTITIONS", "BATCHABLE_OPTIMIZERS", "EXECUTION_FIELDS",
           "MEMBER_FIELDS", "batch_key", "override"]

SYMMETRIES = {"symmetric": None, "bq": "bq", "bqv": "bqv"}
# ECD's per-tensor partition (optimizer_hp["partition"]): GPT-2's own tensors (the fused c_attn
# weight and bias of each layer, as the paper's code has them) or one tensor per parameter.
PARTITIONS = ("gpt2", "parameters")
# Optimizers whose update of stacked runs [R, ...] is each run's own update: ECD (members=R) and
# the elementwise ones. Muon and SOAP act on whole matrices and are refused by --batched.
BATCHABLE_OPTIMIZERS = ("ecd", "adamw", "sgdm")

POSITIVE_INTS = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "steps", "eval_every",
                 "eval_batches", "probe_instances", "checkpoint_every")
TAG_CHARACTERS = set(string.ascii_letters + string.digits + "._=-")
MAX_TAG_LENGTH = 40
#: How a run is executed, not what it computes (torch.compile and ECD's fused kernels change the
#: numbers at round-off only): a result or checkpoint written with other values of these is the
#: same run's, so a run may be resumed compiled or not, with another time budget or checkpoint
#: cadence (a result cut by its time budget, though, is taken up only with the same budget).
EXECUTION_FIELDS = ("compile", "max_wall_s", "checkpoint_every")
#: The settings each member of a batched model has for its own; runs trained as one batched
#: model share every other setting (:func:`batch_key`).
MEMBER_FIELDS = ("seed", "symmetry", "mu_v", "prelu_init", "tag")
# ECD's settings that the trainer derives from the run (key: the control to use instead)
TRAINER_OWNED = {
    "fused": "fused follows compile (set compile=true or false)",
    "chaos_seeds": "chaos_seeds come from seed",
    "members": "members is the number of runs trained at once (--batched)",
    "blocks": "blocks come from optimizer_hp.partition",
}
# The settings of the model that RunConfig passes on to GPTConfig, which validates them.
MODEL_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "n_kv_head", "bias", "rope",
                "activation", "mu_v", "prelu_init")


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class RunConfig:
    """Everything that defines one training run. Its ``name`` (the result's file name) is
    optimizer-symmetry-activation-seed, plus ``tag`` when given: runs of one folder that differ in
    anything else (a sweep's learning rates) need distinct tags.

    The model settings (``n_layer`` ... ``prelu_init``) are :class:`gaugebook.gpt.GPTConfig`'s
    and validated by it; ``optimizer_hp`` goes to :func:`gaugebook.optim.make_optimizer`, except
    ECD's ``partition`` (``"gpt2"`` or ``"parameters"``, required with
    ``projection="per_tensor"``) and SGDM's ``init_velocity_std`` (a random initial momentum
    buffer, as in the paper's code), which the trainer applies. ``max_wall_s`` (seconds, or
    ``None``) stops a call of the trainer after that long, counted from the first step of the
    call (after setup and any resume): a run resumed from a checkpoint gets the whole budget
    again (its recorded ``wall_s`` still adds up every call); the run is then evaluated at its
    last step and recorded ``truncated``. ``compile`` compiles the model with ``torch.compile``
    and lets ECD take its fused Triton kernels on CUDA (:mod:`gaugebook.ecd_kernels`); without
    it ECD's device step is PyTorch's operators.

    Attributes:
        optimizer: ``"ecd"``, ``"adamw"``, ``"sgdm"``, ``"muon"`` or ``"soap"``
            (:func:`gaugebook.optim.make_optimizer`).
        symmetry: ``"symmetric"``, ``"bq"`` (an unlearned query bias) or ``"bqv"`` (unlearned
            query and value biases).
        activation: the MLP's, ``"prelu"`` or ``"gelu"``.
        seed: an integer >= 0 that fixes the model's initialisation, the draws of the unlearned
            biases, the training and validation data, ECD's chaos and SGDM's initial velocity.
        batch_size: sequences per optimizer step, each of ``block_size`` tokens (so
            ``batch_size * block_size`` tokens per step); under DDP split across the ranks.
        steps: optimizer steps, one batch each.
        mu_v: the mean of the unlearned value bias; nonzero only with ``symmetry="bqv"``.
        eval_every: steps between evaluations (validation loss, Noether charges, path length,
            distance from the initial weights); the last step is always evaluated.
        eval_batches: held-out batches of ``batch_size`` sequences whose mean loss is the
            validation loss, the same batches at every evaluation; the first
            ``min(eval_batches, 4)`` also give the end-of-run alignment scores.
        probe_instances: instances per logic-puzzle task (14 tasks), scored once after training
            (:func:`gaugebook.data.evaluate_probes`).
        checkpoint_every: steps between checkpoints (none at the last step).
        autocast_bf16: whether the training steps and the validation loss run under
            ``torch.autocast`` in bfloat16.
    """

    optimizer: str
    symmetry: str = "symmetric"
    activation: str = "prelu"
    seed: int = 0
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    block_size: int = 32
    n_kv_head: int | None = None
    bias: bool = True
    rope: bool | str = False
    prelu_init: str = "constant"
    batch_size: int = 8
    steps: int = 30
    optimizer_hp: dict = field(default_factory=dict)
    mu_v: float = 0.0
    eval_every: int = 10
    eval_batches: int = 2
    probe_instances: int = 16
    checkpoint_every: int = 50
    autocast_bf16: bool = False
    compile: bool = False
    max_wall_s: float | None = None
    tag: str = ""

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; valid: {sorted(OPTIMIZERS)}")
        if self.symmetry not in SYMMETRIES:
            raise ValueError(f"unknown symmetry {self.symmetry!r}; valid: {sorted(SYMMETRIES)}")
        for key in ("seed", *POSITIVE_INTS):
            value, low = getattr(self, key), 0 if key == "seed" else 1
            if type(value) is not int or value < low:
                raise ValueError(f"{key} must be an integer >= {low}, got {value!r}")
        if self.block_size < MIN_PROBE_CONTEXT:
            raise ValueError(f"block_size must be >= {MIN_PROBE_CONTEXT} (the context of the "
                             f"probes evaluated after training), got {self.block_size}")
        if not isinstance(self.optimizer_hp, dict):
            raise ValueError(f"optimizer_hp must be a dict, got {self.optimizer_hp!r}")
        for key in ("autocast_bf16", "compile"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.max_wall_s is not None and not (_is_real(self.max_wall_s) and self.max_wall_s > 0):
            raise ValueError(f"max_wall_s must be None or a positive number of seconds, "
                             f"got {self.max_wall_s!r}")
        if not isinstance(self.tag, str) or len(self.tag) > MAX_TAG_LENGTH \
                or not set(self.tag) <= TAG_CHARACTERS:
            raise ValueError(f"tag must be a string of at most {MAX_TAG_LENGTH} characters from "
                             f"A-Z a-z 0-9 . _ = -, got {self.tag!r}")
        self.model_config(vocab_size=2)  # GPTConfig validates the model settings (activation,
        # mu_v, the widths)
        self._check_trainer_hp()

    def _check_trainer_hp(self) -> None:
        hp = self.optimizer_hp
        if "lr" not in hp:
            raise ValueError(f"optimizer_hp needs a learning rate: set optimizer_hp=dict(lr=...) "
                             f"(the presets' settings for {self.optimizer}: "
                             f"gaugebook.experiment.HP[{self.optimizer!r}])")
        if self.optimizer == "ecd":
            owned = [TRAINER_OWNED[k] for k in hp if k in TRAINER_OWNED]
            if owned:
                raise ValueError("the trainer sets these ECD settings itself: "
                                 + "; ".join(owned))
            projection = hp.get("projection", "global")
            if projection not in PROJECTIONS:
                raise ValueError(f"unknown ECD projection {projection!r}; valid: {PROJECTIONS}")
            partition = hp.get("partition")
            if projection == "per_tensor" and partition not in PARTITIONS:
                raise ValueError("ECD projection='per_tensor' needs a partition: set "
                                 "optimizer_hp.partition to 'gpt2' (the paper's: each layer's "
                                 "fused QKV weight and fused QKV bias are one tensor each) or "
                                 f"'parameters' (one tensor per parameter), got {partition!r}")
            if projection == "global" and partition is not None:
                raise ValueError("optimizer_hp.partition is for projection='per_tensor'; drop it "
                                 "or set optimizer_hp.projection='per_tensor'")
        elif "partition" in hp:
            raise ValueError(f"optimizer_hp.partition is ECD's; {self.optimizer} has none")
        if "init_velocity_std" in hp:
            std = hp["init_velocity_std"]
            if self.optimizer != "sgdm":
                raise ValueError(f"init_velocity_std is SGDM's; {self.optimizer} has none")
            if not _is_real(std) or not math.isfinite(std) or std < 0:
                raise ValueError(f"init_velocity_std must be a number >= 0, got {std!r}")

    @property
    def name(self) -> str:
        """The run's name and its result file's stem, ``optimizer-symmetry-activation-s<seed>``,
        plus ``-<tag>`` when tagged."""
        name = f"{self.optimizer}-{self.symmetry}-{self.activation}-s{self.seed}"
        return f"{name}-{self.tag}" if self.tag else name

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The :class:`~gaugebook.gpt.GPTConfig` of this run's model."""
        return GPTConfig(vocab_size, symmetry_breaking=SYMMETRIES[self.symmetry],
                         **{k: getattr(self, k) for k in MODEL_FIELDS})

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        """The config of a result record's ``config`` (ValueError naming unknown keys and
        missing required ones)."""
        return dataclass_from_dict(cls, values)


def batch_key(cfg: RunConfig) -> tuple:
    """What runs trained as one batched model must share: everything but
    :data:`MEMBER_FIELDS`. Runs with equal keys have parameters of equal shapes and one
    optimizer setting."""
    values = dataclasses.asdict(cfg)
    return tuple((k, json.dumps(values[k], sort_keys=True)) for k in sorted(values)
                 if k not in MEMBER_FIELDS)


def override(cfg: RunConfig, assignments: list[str]) -> RunConfig:
    """A copy of ``cfg`` with ``KEY=VALUE`` assignments applied (unknown keys are an error).
    VALUE is read as JSON where it parses, except for the string settings (``tag=1e-3`` is the
    tag ``"1e-3"``). ``optimizer_hp.KEY=VALUE`` sets one entry of ``optimizer_hp`` and keeps the
    others. ``mu_v``, the mean of the value bias, is set in ``bqv`` runs only (the others have
    no value bias), so that one ``--set mu_v=...`` applies to a whole preset."""
    values = dataclasses.asdict(cfg)
    strings = {f.name for f in dataclasses.fields(RunConfig) if f.type == "str"}
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            value = raw if key in strings else json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        head, dot, entry = key.partition(".")
        if dot and head == "optimizer_hp":
            values["optimizer_hp"] = {**values["optimizer_hp"], entry: value}
        elif dot:
            raise ValueError(f"--set {key}: only optimizer_hp has entries (optimizer_hp.KEY=...)")
        elif key not in values:
            close = difflib.get_close_matches(key, values, n=1)
            hint = (f"did you mean {close[0]}, or the optimizer's optimizer_hp.{key}?" if close
                    else f"an optimizer's setting is set as optimizer_hp.{key}=...")
            raise ValueError(f"--set {key}: no such run setting; {hint} (run settings: "
                             f"{', '.join(sorted(values))})")
        else:
            values[key] = value
    if values["symmetry"] != "bqv":
        values["mu_v"] = 0.0
    return RunConfig.from_dict(values)
