"""Checkpoints of a training state: a thin wrapper over orbax's `CheckpointManager`.

Each step directory `<directory>/<step>/` holds two orbax items: `state` (any pytree of JAX
arrays, `StandardSave`) and `meta` (JSON: config fingerprint, flags, replica info).

- The directory is an `etils.epath` path: a local folder or a bucket (`gs://...`) alike.
- Saves are synchronous by default: once `save()` returns the checkpoint is complete on disk. With
  `async_save=True`, `save()` returns once the state is copied to host memory and orbax writes it
  in the background (training goes on meanwhile); the next save, `save(..., wait=True)` and
  `close()` wait for it; a background save that failed is reported there with its own step. Either
  way a SIGKILL cannot leave a checkpoint half written: orbax writes
  into `<step>.orbax-checkpoint-tmp*` and renames it when done; a tmp directory left by a kill is
  never listed, and is removed the next time a `Checkpointer` opens the directory.
- `restore` takes an abstract target (ShapeDtypeStructs carrying the shardings of the *current*
  mesh), so a checkpoint written on one device count restores onto another.
- Every array leaf's checksum (train/checksums.py) is stored in `meta` and verified on restore, and
  so is a digest of `meta` itself (its fingerprint, flags and those checksums).
- A checkpoint that cannot be read, or whose arrays fail their checksums, is skipped with a
  warning and the previous one is used; the unreadable ones are renamed `<step>.unreadable` so the resumed run can write those steps again.
  A checkpoint that reads fine but does not fit the target or the config raises instead: falling
  back would silently resume from the wrong run.
- Typed PRNG keys (`jax.random.key`) round-trip: orbax stores their uint32 key data and the impl.
- A save that fails (a full disk, no permission) raises `CheckpointWriteError`: one line with the
  step, the OS cause (`No space left on device (ENOSPC)`) and the checkpoints that are intact;
  orbax's own tracebacks of it are kept off the terminal (train/orbax_noise.py).
"""
from __future__ import annotations

import hashlib
import json
import logging

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from ssmgate.storage_error import StorageError, cause
from ssmgate.train import orbax_noise
from ssmgate.train.checksums import mismatches, state_checksums
from ssmgate.train.run_dir import to_jsonable
from ssmgate.tree_paths import path_str

log = logging.getLogger(__name__)

STATE, META = "state", "meta"
META_DIGEST = "meta_digest"
UNREADABLE_SUFFIX = ".unreadable"


class CheckpointError(Exception):
    """No checkpoint can be restored, or a checkpoint does not fit this run."""


class CheckpointWriteError(StorageError):
    """A checkpoint could not be written (disk full, no permission, ...); earlier ones are intact."""


def _registry() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
    reg = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for item, args in [(STATE, ocp.args.StandardSave), (STATE, ocp.args.StandardRestore),
                       (META, ocp.args.JsonSave), (META, ocp.args.JsonRestore)]:
        reg.add(item, args)
    return reg


def _jsonable(obj, what: str):
    """A JSON round trip, so that saved and compared values look alike (tuples become lists)."""
    try:
        return json.loads(json.dumps(to_jsonable(obj)))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{what} must be JSON-serializable: {e}") from e


def _meta_digest(meta: dict) -> str:
    """A digest of the JSON metadata itself: a flipped bit in the stored fingerprint must read as a
    damaged checkpoint (fall back to the previous one), not as a run of another configuration."""
    body = {k: v for k, v in meta.items() if k != META_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _flat(tree) -> dict:
    # Orbax stores namedtuples/dataclasses as dicts and tuples as lists: compare key names only.
    return {path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _stored_form(shape, dtype) -> tuple[tuple, np.dtype]:
    """Shape and dtype as orbax stores them: a typed PRNG key is stored as its uint32 key data."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))
        return tuple(data.shape), np.dtype(data.dtype)
    return tuple(shape), np.dtype(dtype)


def _describe(shape, dtype) -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


def _abstract(target):
    """ShapeDtypeStructs with shardings; leaves without one go to the first device.

    Python scalars stay as they are: orbax saves and restores them as Python scalars.
    """
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def leaf(x):
        if not hasattr(x, "shape"):
            return x
        sharding = getattr(x, "sharding", None) or default
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return jax.tree.map(leaf, target)


def _short(e: BaseException) -> str:
    # Tensorstore errors carry kilobytes of JSON spec; the first line says what went wrong.
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:400]}"


class Checkpointer:
    """Keeps the last `keep` checkpoints of a run in `directory` (= `<run_dir>/checkpoints`)."""

    def __init__(self, directory, *, keep: int = 3, save_every: int | None = None, async_save: bool = False):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (checkpoints to retain), got {keep}")
        if save_every is not None and save_every < 1:
            raise ValueError(f"save_every must be None (only forced saves) or >= 1, got {save_every}")
        self.directory = epath.Path(directory)
        if not self.directory.is_absolute():  # a relative local path; buckets are absolute
            self.directory = epath.Path(self.directory.resolve())
        self.keep, self.save_every, self.async_save = keep, save_every, async_save
        self._writing: int | None = None  # the step of a background save not yet waited for
        self._failed = False  # a save failed: orbax re-raises it at every later wait
        orbax_noise.quiet()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,  # drop tmp dirs of saves interrupted by a kill
            create=True,
        )
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._manager = ocp.CheckpointManager(self.directory, options=options, handler_registry=_registry())
        except OSError as e:
            raise StorageError(f"cannot open the checkpoint folder {self.directory}: {cause(e)}") from e

    def should_save(self, step: int) -> bool:
        return self.save_every is not None and step > 0 and step % self.save_every == 0

    def save(self, step: int, state, *, meta: dict, force: bool = False, wait: bool = False) -> None:
        """Writes `state` and `meta` at `step` if `force` or `should_save(step)`; returns when it is
        on disk, or with `async_save` once it is in host memory unless `wait`.

        A step that already has a checkpoint is left alone: under the training contract the
        state at a step does not depend on how the run got there.
        """
        step = int(step)
        if not (force or self.should_save(step)):
            return
        if step in self.steps():
            log.debug("checkpoint step %d already in %s; not saving again", step, self.directory)
            return
        meta = dict(_jsonable(meta, f"meta for checkpoint step {step}"), checksums=state_checksums(state))
        meta.pop(META_DIGEST, None)
        meta[META_DIGEST] = _meta_digest(meta)
        self.wait()  # a background save of an earlier step that failed is reported as that step
        self._writing = step
        try:
            self._manager.save(step, force=True, args=ocp.args.Composite(
                **{STATE: ocp.args.StandardSave(state), META: ocp.args.JsonSave(meta)}))
        except Exception as e:
            self._fail(e)
        if wait or not self.async_save:
            self.wait()

    def wait(self) -> None:
        """Waits for a background save; raises CheckpointWriteError naming its step if it failed."""
        if self._writing is None:
            return
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            self._fail(e)
        self._writing = None

    def _fail(self, e: Exception):
        # orbax writes into a tmp directory first: the finished steps stay as they were
        step, self._writing, self._failed = self._writing, None, True
        raise CheckpointWriteError(f"cannot write checkpoint step {step} to {self.directory}: {cause(e)}; the "
                                   f"checkpoints already there ({self._finished_steps()}) are intact") from e

    def _finished_steps(self) -> list[int]:
        """The finished step folders on disk (orbax's own list may still hold a failed step)."""
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, target, *, step: int | None = None, expect_fingerprint: str | None = None,
                expect_flags: dict | None = None):
        """Returns `(step, state, meta)` from `step`, or from the newest readable checkpoint.

        `target`: pytree of ShapeDtypeStructs (or arrays) whose shardings place the result.
        `expect_fingerprint`: if given, `meta["fingerprint"]` must equal it; `expect_flags`
        (this run's flags) lets the error list the flags that differ from `meta["flags"]`.
        """
        self._manager.reload()  # the directory may have changed since this object was made
        available = self.steps()
        if step is not None and step not in available:
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; "
                                  f"available steps: {available}")
        candidates = [int(step)] if step is not None else available[::-1]
        if not candidates:
            raise CheckpointError(f"no checkpoints in {self.directory}")
        abstract = _abstract(target)
        errors: dict[int, str] = {}
        for s in candidates:
            try:
                meta = self._read_meta(s, expect_fingerprint, expect_flags)
                self._check_fits(s, abstract)
                state = self._manager.restore(s, args=ocp.args.Composite(
                    **{STATE: ocp.args.StandardRestore(abstract)}))[STATE]
                meta = dict(meta)
                meta.pop(META_DIGEST, None)
                bad = mismatches(meta.pop("checksums", {}), state)  # checkpoints before 2026-12-03 have none
                if bad:
                    raise ValueError(f"checksum mismatch in {len(bad)} leaves ({', '.join(bad[:3])}): the data "
                                     f"files changed after they were written")
            except CheckpointError:
                raise
            except Exception as e:  # anything else means the files could not be read
                errors[s] = _short(e)
                log.warning("checkpoint step %d in %s cannot be read (%s); trying the previous one",
                            s, self.directory, errors[s])
                continue
            self._set_aside(errors)
            return s, state, meta
        raise CheckpointError(f"no checkpoint in {self.directory} could be restored: "
                              + "; ".join(f"step {s}: {err}" for s, err in errors.items()))

    def restore_raw(self, step: int | None = None):
        """`(step, state, meta)` of `step` (default: the latest) as saved, without a target: the
        state as nested dicts and lists of arrays (a TrainState comes back as {"step", "params",
        "opt_state", "rng"}). For tools that edit a checkpoint; training restores with `restore`."""
        self._manager.reload()
        step = self.latest_step() if step is None else int(step)
        if step is None or step not in self.steps():
            raise CheckpointError(f"no checkpoint{'' if step is None else f' for step {step}'} in {self.directory}; "
                                  f"available steps: {self.steps()}")
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(
                **{STATE: ocp.args.StandardRestore(), META: ocp.args.JsonRestore()}))
        except Exception as e:
            raise CheckpointError(f"checkpoint step {step} in {self.directory} cannot be read: {_short(e)}") from e
        return step, out[STATE], out[META]

    def close(self) -> None:
        """Waits for a background save (CheckpointWriteError if it failed) and closes the manager."""
        try:
            self.wait()
        finally:
            try:
                self._manager.close()
            except Exception:
                if not self._failed:  # after a failed save orbax raises that failure again: reported already
                    raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- restore helpers ---------------------------------------------------------------------

    def _read_meta(self, step: int, expect_fingerprint, expect_flags) -> dict:
        meta = self._manager.restore(step, args=ocp.args.Composite(
            **{META: ocp.args.JsonRestore()}))[META]
        if not isinstance(meta, dict):
            raise ValueError(f"meta is {type(meta).__name__}, expected a JSON object")
        if META_DIGEST in meta and meta[META_DIGEST] != _meta_digest(meta):  # older checkpoints have none
            raise ValueError("the metadata (meta/) fails its digest: the file changed after it was written")
        saved = meta.get("fingerprint")
        if expect_fingerprint is None or saved == expect_fingerprint:
            return meta
        msg = (f"checkpoint step {step} in {self.directory} was written with config fingerprint "
               f"{saved!r}, but this run's fingerprint is {expect_fingerprint!r}")
        flags = meta.get("flags")
        if isinstance(flags, dict) and expect_flags is not None:
            now, unset = _jsonable(expect_flags, "expect_flags"), "<unset>"
            diff = [k for k in sorted(set(flags) | set(now)) if flags.get(k, unset) != now.get(k, unset)]
            msg += "; flags that differ: " + (", ".join(
                f"{k} (saved {flags.get(k, unset)!r}, now {now.get(k, unset)!r})" for k in diff)
                or "none (the fingerprint covers more than the flags)")
        elif isinstance(flags, dict):
            msg += f"; saved flags: {flags}"
        raise CheckpointError(msg + ". Resume with the original config or use a new run directory.")

    def _check_fits(self, step: int, abstract) -> None:
        """Compares orbax's stored tree metadata with the target, before reading any array."""
        tree_md = self._manager.item_metadata(step)[STATE]
        if tree_md is None:
            raise ValueError("tree metadata of the state (state/_METADATA) is missing")
        saved = _flat(getattr(tree_md, "tree", tree_md))
        expected = _flat(abstract)
        where = f"checkpoint step {step} in {self.directory} does not match the target"
        for path, leaf in expected.items():
            dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
            want = _stored_form(np.shape(leaf), dtype)
            if path not in saved:
                raise CheckpointError(f"{where}: {path} (expected {_describe(*want)}) is not in the "
                                      f"checkpoint, which holds {sorted(saved)}")
            md = saved[path]
            if not hasattr(md, "shape") or not hasattr(md, "dtype"):
                continue  # a non-array leaf: orbax checks it on restore
            got = (tuple(md.shape), np.dtype(md.dtype))
            if isinstance(md, ocp.metadata.ScalarMetadata) and want[0] == ():
                continue  # a saved Python scalar: its recorded dtype (int64/float64) is nominal
            if got != want:
                raise CheckpointError(f"{where}: {path} is {_describe(*got)} in the checkpoint, "
                                      f"expected {_describe(*want)}")
        extra = [p for p in saved if p not in expected]
        if extra:
            raise CheckpointError(f"{where}: {extra[0]} is in the checkpoint but not in the target "
                                  f"({len(extra)} such leaves: {extra[:5]})")

    def _set_aside(self, errors: dict[int, str]) -> None:
        """Renames unreadable checkpoints newer than the restored one, out of orbax's sight.

        The resumed run writes these steps again; left in place they would block those saves
        and count towards `keep`. Renamed, not deleted, so they can still be inspected.
        """
        # One host renames (the directory is shared); every host reloads.
        for s in (errors if jax.process_index() == 0 else {}):
            src = self.directory / str(s)  # default orbax step naming: no prefix, no padding
            if not src.is_dir():
                continue
            dst, i = self.directory / f"{s}{UNREADABLE_SUFFIX}", 0
            while dst.exists():
                i += 1
                dst = self.directory / f"{s}{UNREADABLE_SUFFIX}-{i}"
            src.rename(dst)
            log.warning("moved unreadable checkpoint step %d to %s", s, dst)
        if errors:
            self._manager.reload()
