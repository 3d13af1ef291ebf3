"""The worker process's main loop (``python -m specverify.auditing.isolation.worker FD``).

It receives pickled requests on the socket ``FD`` from :class:`specverify.auditing.isolation.process.WorkerProcess`
and answers each one; it never raises out of a request (every exception of the function, even
``KeyboardInterrupt`` and ``SystemExit``, is an answer).  Requests:

- ``load``: set ``sys.path`` and the torch thread count as in the parent, load the target
  (target string or pickled callable), build the decoder level's tiny models itself; answer
  ``("loaded", {"parameters": ...})`` or ``("load-failed", message)``;
- ``steps``: call the SPEC §1 function once per group of consecutive rows of the shared buffer
  with one persistent generator (and, for a ragged request, the group's ``num_draft_tokens=``),
  validate each output and copy it into the buffer at once; answer ``("ok", seconds, aliased,
  untouched)`` or ``("fault", kind, message, group)``;
- ``tree``: one SPEC §3 call on the four tensors of the shared buffer with a persistent
  generator, the output validated (a root-to-node path) and copied into the buffer; answer
  ``("ok", seconds, aliased, untouched)`` or ``("fault", kind, message, 0)``;
- ``raw``: call the function with the given arguments (its tensors in the shared buffer, the rest
  pickled), answer ``("raw-ok", result, seconds, untouched)`` or ``("raw-error", name, message)``;
- ``generate``: one SPEC §2 call on the worker's own models; answer the tokens and whether
  ``input_ids`` or the models' parameters changed (the models are then restored);
- ``stop``: end at once with ``os._exit`` (threads the function started do not keep it alive).

On the CPU, ``steps`` and ``tree`` run the function with its inputs' pages read-only, and
``raw`` with its tensor arguments' pages read-only
(:class:`~specverify.auditing.isolation.write_guard.WriteGuard`); ``untouched`` says that no
write reached them, so the audit need not compare them with what it presented, nor present them
again.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from specverify.auditing.isolation.write_guard import WriteGuard


def _die_with_parent() -> None:
    """Linux: have the kernel kill this process when the audit's process dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Worker:
    def __init__(self) -> None:
        self.fn: Any = None
        self.level = "sampler"
        self.device = "cpu"
        self.buffer: Any = None
        self.regions: tuple[tuple, list[Any]] | None = None
        self.generators: dict[int, Any] = {}
        self.alias_watch: Any = None
        self.models: Any = None
        self.guard = WriteGuard()

    # -- requests ----------------------------------------------------------------------------

    def load(self, request: dict[str, Any]) -> tuple:
        import inspect

        import torch

        sys.path[:] = request["sys_path"]
        torch.set_num_threads(max(1, int(request["threads"])))
        self.level, self.device = request["level"], request["device"]
        target = request["target"]
        try:
            if target.kind == "spec":
                from specverify.auditing.loading import load_target

                self.fn = load_target(target.value, self.level)
            else:
                self.fn = pickle.loads(target.value)
        except BaseException as error:  # noqa: BLE001 - whatever the import does is the answer
            return ("load-failed", f"{type(error).__name__}: {error}" if target.kind == "pickle" else str(error))
        try:
            parameters = [(p.name, p.kind, p.default is not inspect.Parameter.empty)
                          for p in inspect.signature(self.fn).parameters.values()]
        except (TypeError, ValueError):
            parameters = []
        from specverify.auditing.isolation.guarded import AliasWatch

        self.alias_watch = AliasWatch()
        if self.level == "decoder":
            from specverify.auditing.decoder.battery import DecoderModels

            self.models = DecoderModels(self.device)
        from specverify.auditing.isolation.guarded import DECLARED_ATTRIBUTES

        info: dict[str, Any] = {"parameters": parameters, "declared": {}}
        for name in DECLARED_ATTRIBUTES:
            declared = getattr(self.fn, name, None)
            try:
                pickle.dumps(declared)
            except Exception:
                declared = repr(declared)  # reported as malformed by the audit
            info["declared"][name] = declared
        return ("loaded", info)

    def _generator(self, handle: Any) -> Any:
        import torch

        from specverify.auditing.isolation.faults import seed_global_rng

        if handle.key not in self.generators:
            seed_global_rng(handle.global_seed)
            self.generators[handle.key] = torch.Generator(device=self.device).manual_seed(handle.seed)
        return self.generators[handle.key]

    def steps(self, request: dict[str, Any]) -> tuple:
        from specverify.auditing.isolation.faults import Fault
        from specverify.auditing.isolation.guarded import checked_emitted, exception_message

        target, draft, tokens, *ragged, output = self._views(request)
        num_draft_tokens = ragged[0] if request.get("ragged") else None
        vocab = target.shape[-1]
        generator = self._generator(request["generator"])
        on_cpu = self.device == "cpu"
        first = start = request["row"]
        seconds, aliased, groups = 0.0, False, request["groups"]
        clean = self._cover(request)
        sent = [tensor.narrow(0, first, sum(groups)) for tensor in (target, draft, tokens)]
        drafts = sent[2].clone()  # as sent: a call may write its inputs (the guard reports it)
        width = output.shape[1]
        try:
            for number, (rows, *inputs) in enumerate(zip(groups, *(tensor.split(groups) for tensor in sent))):
                rows_slice = slice(start, start + rows)
                passed = inputs if on_cpu else [_on_device(t, self.device) for t in inputs]
                keywords = {} if num_draft_tokens is None else {
                    "num_draft_tokens": num_draft_tokens[rows_slice].clone().to(self.device)}
                started = time.perf_counter()
                try:
                    result = self.fn(*passed, generator, **keywords)
                except BaseException as error:  # noqa: BLE001 - KeyboardInterrupt/SystemExit are the function's
                    return ("fault", "exception", exception_message(error, "{what}"), number)
                seconds += time.perf_counter() - started
                copied = output[rows_slice]
                if _plain(result, rows, width):  # its copy out is the alias watch's copy of its values
                    copied.copy_(result)
                    aliased = self.alias_watch.after_call(result, copied) or aliased
                else:
                    aliased = self.alias_watch.after_call(result) or aliased
                    try:
                        copied.copy_(checked_emitted(result, drafts[start - first:start - first + rows], vocab))
                    except Fault as fault:
                        return ("fault", fault.kind, fault.message, number)
                if not on_cpu:
                    for view, tensor in zip(inputs, passed):
                        view.copy_(tensor)
                start += rows
        finally:
            self.alias_watch.own_copy()  # the next request writes the output region
        return ("ok", seconds, aliased, clean and self.guard.untouched())

    def _buffer(self, request: dict[str, Any]) -> Any:
        """The shared buffer ``request["buffer"]`` names, mapped once and kept while it stays the same."""
        from specverify.auditing.isolation.process import SharedBuffer

        path, size = request["buffer"]
        if self.buffer is None or self.buffer.path != path:
            self.guard.release()
            self.regions = None
            if self.buffer is not None:
                self.buffer.close()
            self.buffer = SharedBuffer.open(path, size)
        return self.buffer

    def _cover(self, request: dict[str, Any]) -> bool:
        """Guard the request's inputs (the buffer up to the output's page) against writes; on
        another device than the CPU the worker copies the inputs back itself, and nothing is
        guarded.  True when they are guarded and nothing wrote them since the last request."""
        length = request["inputs_bytes"] if self.device == "cpu" else 0
        return self.guard.cover(self._buffer(request).address, length)

    def _views(self, request: dict[str, Any]) -> list[Any]:
        """The request's tensors in the shared buffer, fresh views (each input the leading block of
        its region, wider when strided) of the regions of the last layout, which are kept while
        the buffer (:meth:`_buffer` forgets them) and the layout stay the same."""
        import torch

        from specverify.auditing.isolation.presentation import view_of

        buffer = self._buffer(request)
        key = (tuple(request["offsets"]), tuple(request["dtypes"]), tuple(tuple(shape) for shape in request["shapes"]))
        if self.regions is None or self.regions[0] != key:
            self.regions = key, [buffer.tensor(offset, getattr(torch, dtype), tuple(shape))
                                 for offset, dtype, shape in zip(request["offsets"], request["dtypes"],
                                                                 request["shapes"])]
        return [view_of(storage, tuple(shape)) for storage, shape in zip(self.regions[1], request["views"])]

    def tree(self, request: dict[str, Any]) -> tuple:
        """One SPEC §3 call on the four input tensors of the shared buffer; the validated output
        goes into its fifth tensor."""
        from specverify.auditing.isolation.faults import Fault, validate_tree_emitted
        from specverify.auditing.isolation.guarded import exception_message

        *inputs, output = self._views(request)
        tree_tokens, parents = inputs[2].clone(), inputs[3].clone()
        generator = self._generator(request["generator"])
        on_cpu = self.device == "cpu"
        passed = inputs if on_cpu else [_on_device(t, self.device) for t in inputs]
        clean = self._cover(request)
        started = time.perf_counter()
        try:
            result = self.fn(*passed, generator)
        except BaseException as error:  # noqa: BLE001 - KeyboardInterrupt/SystemExit are the function's
            return ("fault", "exception", exception_message(error, "{what}"), 0)
        seconds = time.perf_counter() - started
        untouched = clean and self.guard.untouched()
        aliased = self.alias_watch.after_call(result)
        try:
            emitted, _, _ = validate_tree_emitted(result, tree_tokens, parents, inputs[0].shape[-1])
        except Fault as fault:
            return ("fault", fault.kind.value, fault.message, 0)
        except Exception as error:
            return ("fault", "malformed", f"returned output the audit could not read ({type(error).__name__}: {error})",
                    0)
        output.copy_(emitted)
        if not on_cpu:
            for view, tensor in zip(inputs, passed):
                view.copy_(tensor)
        return ("ok", seconds, aliased, untouched)

    def raw(self, request: dict[str, Any]) -> tuple:
        import torch

        from specverify.core.outputs import emitted_tensor

        args, kwargs = list(request["args"]), dict(request["kwargs"])
        clean = False
        if request.get("shared"):
            buffer = self._buffer(request)
            for key, offset, dtype, span, shape, stride, start in request["shared"]:
                region = buffer.tensor(offset, getattr(torch, dtype), (span,))
                tensor = region.as_strided(tuple(shape), tuple(stride), start)
                if isinstance(key, int):
                    args[key] = tensor
                else:
                    kwargs[key] = tensor
            clean = self.guard.cover(buffer.address, request["inputs_bytes"])
        else:
            self.guard.release()
        started = time.perf_counter()
        try:
            result = self.fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001
            return ("raw-error", type(error).__name__, str(error))
        seconds = time.perf_counter() - started
        untouched = clean and self.guard.untouched()
        try:
            pickle.dumps(result)
        except Exception:
            try:
                result = emitted_tensor(result).detach().cpu().clone()
            except Exception as error:
                return ("raw-error", type(error).__name__, f"the output cannot be sent to the audit: {error}")
        if isinstance(result, torch.Tensor):
            if result.layout == torch.strided and result.device.type != "meta":
                result = result.detach().cpu().clone()
        return ("raw-ok", result, seconds, untouched)

    def generate(self, request: dict[str, Any]) -> tuple:
        import torch

        from specverify.auditing.isolation.faults import (
            Fault,
            seed_global_rng,
            validate_new_tokens,
        )
        from specverify.auditing.isolation.guarded import exception_message

        seed_global_rng(request["global_seed"])
        models = self.models
        original = torch.tensor([request["prompt"]], dtype=torch.int64, device=models.device)
        passed = original.clone()
        started = time.perf_counter()
        target, draft = models.pair(request["models"])
        try:
            result = self.fn(target, draft, passed, max_new_tokens=request["max_new_tokens"],
                             temperature=request["temperature"], top_k=request["top_k"], top_p=request["top_p"],
                             seed=request["seed"])
        except BaseException as error:  # noqa: BLE001
            return ("fault", "exception", exception_message(error, "{what}"))
        seconds = time.perf_counter() - started
        try:
            tokens = validate_new_tokens(result, request["max_new_tokens"], models.vocab_size).tolist()
        except Fault as fault:
            return ("fault", fault.kind, fault.message)
        except Exception as error:
            return ("fault", "malformed", f"returned output the audit could not read ({type(error).__name__}: {error})")
        mutated = not torch.equal(passed.cpu(), original.cpu())
        changed = models.changed()
        if changed:
            self.models = type(models)(self.device)  # later calls get the audit's models again
        return ("ok", tokens, seconds, mutated, changed)


def _on_device(view: Any, device: str) -> Any:
    """``view`` on ``device`` with its strides and the rest of its region kept: a strided input
    stays the leading block of its wider buffer there too, decoy padding included."""
    base = view if view._base is None else view._base
    moved = base.to(device)
    return moved.as_strided(tuple(view.shape), view.stride(), view.storage_offset() - base.storage_offset())


def _plain(result: Any, rows: int, width: int) -> bool:
    """A dense int64 CPU tensor of the expected shape: copied as is (the parent validates the
    values of the whole request at once); anything else goes through the full per-call check."""
    import torch

    return (type(result) is torch.Tensor and result.layout == torch.strided and result.device.type == "cpu"
            and result.dtype == torch.int64 and tuple(result.shape) == (rows, width))


def main(descriptor: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the user's Ctrl-C is for the audit, not the function
    _die_with_parent()
    connection = Connection(descriptor)
    import specverify.auditing.isolation.guarded  # noqa: F401 - torch and what every load needs, before the request

    worker = Worker()
    handlers = {"load": worker.load, "steps": worker.steps, "tree": worker.tree, "raw": worker.raw,
                "generate": worker.generate}
    while True:
        try:
            request = pickle.loads(connection.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)
        if request.get("op") == "stop":
            os._exit(0)
        if request["op"] not in ("steps", "tree", "raw"):
            worker.guard.release()
        try:
            reply = handlers[request["op"]](request)
        except BaseException as error:  # noqa: BLE001 - a failure of the worker itself
            reply = ("fault", "exception", f"the audit's worker failed: {type(error).__name__}: {error}", 0)
        try:
            data = pickle.dumps(reply)
        except Exception as error:
            data = pickle.dumps(("fault", "malformed", f"the output cannot be sent to the audit: {error}", 0))
        try:
            connection.send_bytes(data)
        except (OSError, ValueError):
            os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]))
