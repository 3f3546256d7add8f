"""Where a dense system's encoder comes from (its `origin`), shared by every stage that loads it
(encode, search, train, mining, silver's dense retriever, refresh): the system's own trained
model, another system's (`init_from: NAME`), a model artifact of any run in the store
(`init_from: dense_model:VERSION`), a pre-trained base encoder (`init_from: pretrain:NAME`), a
folder (`init_from: path`), or the base checkpoint.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict

from storage import Artifact
from tasks.compute.bi_encoder import load_bi_encoder
from tasks.engine import Pinned
from tasks.errors import InputError
from tasks.stage_refs import MODEL_ARTIFACT, parse_init_from


class Origin(BaseModel):
    """Where a system's starting encoder comes from (see the module docstring)."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    model: dict                             # the system's model section (base, towers, pooling, ...)
    model_input: Optional[str] = None       # the input whose model/ folder holds the weights
    init_path: Optional[str] = None         # a folder on this machine (not hashed: init_hash is)
    init_hash: Optional[str] = None

    def folder(self, inputs: dict[str, Artifact]) -> Optional[Path]:
        """The weights' folder (None: the base checkpoint of the model section)."""
        if self.model_input is not None:
            return inputs[self.model_input].subdir("model")
        return Path(self.init_path) if self.init_path is not None else None

    def load(self, inputs: dict[str, Artifact]):
        return self.load_from(self.folder(inputs))

    def load_from(self, path: Optional[Path]):
        if path is not None:
            from models.bi_encoder import CONFIG_NAME

            # A saved bi-encoder keeps its own towers; an exported or plain HF folder (a pretrain
            # stage's base checkpoint) is a backbone under this system's model section.
            return load_bi_encoder(self.model, path) if (path / CONFIG_NAME).is_file() else \
                load_bi_encoder({**self.model, "base": str(path)})
        return load_bi_encoder(self.model)


def folder_hash(path: Path) -> str:
    from models.runtime_cache import folder_digest

    return folder_digest(path)  # the same digest keys runtime conversions


def origin_of(system, cfg_dir: Path | None = None, trained: bool = True) -> tuple[Origin, tuple[str, ...], dict[str, Pinned]]:
    """(origin, input stages, pinned inputs) of `system`'s encoder: with `trained`, its own train
    stage when it has one; otherwise where training starts from."""
    model = system.model.model_dump()
    if trained and system.train is not None:
        return Origin(model=model, model_input=f"train:{system.name}"), (f"train:{system.name}",), {}
    init = parse_init_from(system.init_from)
    if init is None:
        return Origin(model=model), (), {}
    if init.kind == "pretrain":  # a pretrain stage's base checkpoint (its model/ folder)
        stage = f"pretrain:{init.target}"
        return Origin(model=model, model_input=stage), (stage,), {}
    if init.kind == "artifact":
        return Origin(model=model, model_input="init"), (), {"init": Pinned(MODEL_ARTIFACT, init.target)}
    if init.kind == "config":
        raise ValueError(f"dense system {system.name!r} init_from {system.init_from!r}: another config's system "
                         "is resolved to its model's version when the plan is made (flows/registry.py)")
    if init.kind == "path":
        path = Path(init.target).expanduser()
        if not path.is_absolute():
            path = (cfg_dir or Path.cwd()) / path
        if not path.is_dir():
            raise InputError(path, f"dense system {system.name!r} init_from", "no such model folder")
        return Origin(model=model, init_path=str(path.resolve()), init_hash=folder_hash(path)), (), {}
    return Origin(model=model, model_input=f"train:{init.target}"), (f"train:{init.target}",), {}
