"""``kiln serve``: an exported model behind HTTP on LitServe, batched; an answer is what ``kiln infer`` writes for
the same input (one code path: kiln.commands.exported). ``/health`` says ok once the weights are loaded and a
warm-up call ran; ``/info`` names the checkpoint, its run and the input it takes."""

import base64
import binascii
import io
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import litserve as ls
import numpy as np
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse

from kiln.commands.arguments import OneLineParser
from kiln.commands.exported import Exported, describe, load, rows
from kiln.errors import DataError, UsageError, first_line


class JsonBodies:
    """Every body but a multipart upload is JSON (``curl -d`` says form-urlencoded), and one that does not parse is a
    400 in one line, where LitServe would answer a 500. An ASGI middleware."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = dict(scope.get("headers") or []).get(b"content-type", b"")
        if scope["type"] != "http" or scope.get("method") != "POST" or kind.startswith(b"multipart/"):
            return await self.app(scope, receive, send)
        body, more = b"", True
        try:
            while more:
                message = await receive()
                body, more = body + message.get("body", b""), message.get("more_body", False)
            json.loads(body)
        except HTTPException as err:  # a payload over the limit, refused while it was read
            return await JSONResponse({"detail": err.detail}, err.status_code)(scope, receive, send)
        except ValueError:
            line = 'the body is not JSON: send {"input": [...]} or {"image": "<base64>"}, or a multipart form'
            return await JSONResponse({"detail": line}, 400)(scope, receive, send)
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        await self.app(
            {**scope, "headers": [*headers, (b"content-type", b"application/json")]}, _replay(body, receive), send
        )


def _replay(body: bytes, receive: Any) -> Any:
    """An ASGI ``receive`` that gives ``body`` once, whole, then what the connection says (a disconnect)."""
    given = False

    async def replay() -> dict[str, Any]:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class Served(ls.LitAPI):
    """One worker's model: requests decoded one by one, run in the batches LitServe gathers."""

    def __init__(self, model: Path, max_batch_size: int, batch_timeout: float) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.model_path = model

    def setup(self, device: str) -> None:
        """In the model's process: Ctrl-C (SIGINT to the terminal's whole group) is the main process's to act on,
        which stops this one; here it printed a KeyboardInterrupt traceback from LitServe's queue."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.model = warmed_up(self.model_path)

    def decode_request(self, request: Request) -> tuple[np.ndarray, str | None] | HTTPException:
        """LitServe reads the annotation: ``Request`` gives the body as parsed JSON, or a multipart form. A request
        refused is kept as its refusal, answered alone: LitServe fails a whole batch on anything raised."""
        try:
            return sample(request, self.model)
        except HTTPException as refused:
            return refused

    def batch(self, inputs: list) -> list:
        return inputs

    def predict(self, inputs: Any) -> Any:
        batch = inputs if isinstance(inputs, list) else [inputs]
        taken = [item for item in batch if not isinstance(item, HTTPException)]
        answers = iter(self._answers(taken) if taken else [])
        answered = [item if isinstance(item, HTTPException) else next(answers) for item in batch]
        return answered if isinstance(inputs, list) else answered[0]

    def _answers(self, taken: list[tuple[np.ndarray, str | None]]) -> list[dict[str, Any]]:
        header, values, arrays = rows(self.model.run(np.stack([x for x, _ in taken])), self.model.spec)
        answers = [answer(header, values[i], {k: v[i] for k, v in arrays.items()}) for i in range(len(taken))]
        for one, (_, note) in zip(answers, taken, strict=True):
            one.update({"batch": len(taken), **({"resized": note} if note else {})})
        return answers

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, output: Any) -> Any:
        if isinstance(output, HTTPException):  # its status and line, for this request only
            return JSONResponse({"detail": output.detail}, output.status_code)
        return output


def warmed_up(path: Path) -> Exported:
    """The model, after a batch of one sample of the input it says it takes ran: /health says ok only after it,
    and a model that cannot run stops the server before it listens, in one line."""
    model = load(path, "serve", spin=False)
    spec = model.spec
    try:
        model.run(np.zeros((1, *spec["input_shape"]), dtype=spec.get("dtype", "float32")))
    except Exception as err:  # onnxruntime's own (InvalidArgument, Fail): a model and a preprocess.json that disagree
        reason = first_line(err)
        raise UsageError(f"kiln serve: {path} does not run on a sample of shape {spec['input_shape']}, what its "
                         f"preprocess.json says it takes ({reason}): export it again") from None  # fmt: skip
    return model


def answer(header: list[str], row: list[Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """A sample's answer: a classifier's class and its probabilities by class name (the softmax of the exported
    logits), any other model's outputs by name, dense ones as nested lists."""
    if header[:2] == ["predicted", "class"]:
        names = [h.removeprefix("p_") for h in header[2:]]
        return {"predicted": row[0], "class": row[1], "probabilities": dict(zip(names, row[2:], strict=True))}
    found = {h: v for h, v in zip(header, row, strict=True) if h != "array_row"}
    return {**found, **{name: array.tolist() for name, array in arrays.items()}}


def _refuse(status: int, line: str, model: Exported) -> HTTPException:
    spec = model.spec
    how = f'{{"input": <an array of shape {spec["input_shape"]}>}}'
    if model.image:
        how += ', {"image": "<base64 of an image file>"}, or a multipart upload named image'
    return HTTPException(status, f"{line}: send {how}")


def sample(request: Any, model: Exported) -> tuple[np.ndarray, str | None]:
    """A request's one sample as the network takes it, and a line when its image was resized."""
    if not hasattr(request, "get") or ("input" in request) == ("image" in request):
        raise _refuse(400, "a request gives either input or image", model)
    if "image" in request and model.image:
        return _image(request["image"], model)
    if "image" in request:
        raise _refuse(422, f"this model takes arrays of shape {model.spec['input_shape']}, not images", model)
    try:
        raw = np.asarray(request["input"])
    except ValueError as err:
        raise _refuse(422, f"input is not an array ({str(err).splitlines()[0]})", model) from None
    shape = model.spec["input_shape"]
    if list(raw.shape) != shape or raw.dtype.kind not in "iuf" or (model.ids and raw.dtype.kind == "f"):
        given = f"{raw.dtype} values" if raw.dtype.kind in "iuf" else "values that are not all numbers"
        kind = "integer ids" if model.ids else "numbers"
        raise _refuse(422, f"input: {given} of shape {list(raw.shape)}, where the model takes one sample of {kind} "
                      f"of shape {shape}", model)  # fmt: skip
    if raw.dtype.kind == "f" and not np.isfinite(raw).all():  # JSON as Python reads it takes NaN and Infinity
        raise _refuse(422, f"input: {int((~np.isfinite(raw)).sum())} values are NaN or infinite", model)
    if model.image and raw.dtype.kind in "iu":
        if raw.min() < 0 or raw.max() > 255:
            raise _refuse(422, "input: integers are pixels from 0 to 255 (floats: values in [0, 1])", model)
        raw = raw.astype(np.uint8)
    return model.samples(raw[None])[0], None


def _image(given: Any, model: Exported) -> tuple[np.ndarray, str | None]:
    """An image's bytes (base64 in JSON, or a multipart upload) decoded and resized as ``kiln infer`` does."""
    try:
        data = given.file.read() if hasattr(given, "file") else base64.b64decode(given, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise _refuse(422, "image: not base64", model) from None
    stream = io.BytesIO(data)
    stream.name = "image"
    try:
        sample, size = model.image_sample(stream)
    except DataError as err:
        raise _refuse(422, str(err), model) from None
    height, width = model.spec["input_shape"][1:]
    note = (
        None
        if size == (width, height)
        else f"resized from {size[0]}x{size[1]} to {width}x{height} ({model.spec.get('resize')})"
    )
    return sample, note


def _exported_from(options: Any) -> Path:
    """``--model``, or the export of ``--ckpt_path`` (resolved as every command resolves it) in its run folder's
    ``export/``, written there first when it is not."""
    if options.model:
        return Path(options.model) / "model.onnx" if Path(options.model).is_dir() else Path(options.model)
    from kiln.commands import export, exporting

    found = export.checkpoint(options.ckpt_path, options.config, options.root, options.name)
    assert found.path is not None
    output = export.default_output(found.path)
    parity = output / "parity.json"
    if not output.exists():
        checked = export.BATCH_SIZES, export.TOLERANCE, export.SAMPLES  # the parity check kiln export runs
        exporting.export(str(found.path), output, ["onnx"], *checked, version=found.version)
        print(f"exported {found.path} to {output}", file=sys.stderr)
    elif not parity.is_file() or json.loads(parity.read_text()).get("checkpoint") != str(found.path):
        raise UsageError(f"kiln serve: {output} holds the export of another checkpoint: serve it with --model "
                         f"{output / 'model.onnx'}, or remove it to serve {found.path}")  # fmt: skip
    return output / "model.onnx"


def _stop_on_sigterm(main: int) -> Any:
    """SIGTERM in this process: LitServe's graceful shutdown (its HTTP servers drain, then its workers stop); in
    the HTTP servers forked from it, the default, once uvicorn has drained and hands the signal back."""

    def stop(*_: Any) -> None:
        if os.getpid() == main:  # LitServe then warns of each HTTP server this signal already stopped: not news
            logging.getLogger("litserve.server").addFilter(lambda record: "Already not alive" not in record.msg)
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)

    return stop


def serve_command(args: list[str]) -> None:
    """``kiln serve --model DIR/model.onnx | --ckpt_path FILE|best|last [-c FILE] [--port 8000] [...]``."""
    parser = OneLineParser(prog="kiln serve", description="Serve an exported model over HTTP (LitServe).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="model.onnx from `kiln export`, or the folder it is in")
    source.add_argument("--ckpt_path", help="a checkpoint, best or last: exported to its run's export/ first")
    parser.add_argument("-c", "--config", action="append", default=[], help="for best and last: the experiment's")
    parser.add_argument("--run.root", dest="root", help="for best and last: run.root, as kiln fit takes it")
    parser.add_argument("--run.name", dest="name", help="for best and last: run.name, as kiln fit takes it")
    parser.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1", "0.0.0.0", "::"])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max_batch_size", type=int, default=32, help="requests run together at most")
    parser.add_argument("--batch_timeout", type=float, default=0.001, help="seconds a batch waits to fill")
    parser.add_argument("--workers", type=int, default=1, help="model processes (each its own onnxruntime)")
    parser.add_argument("--http_processes", type=int, default=min(4, os.cpu_count() or 1), help="processes that "
                        "answer HTTP and decode requests (default: the cores, at most 4)")  # fmt: skip
    parser.add_argument("--max_payload_mb", type=float, default=16.0, help="a larger request is refused (413)")
    options = parser.parse_args(args)
    if min(options.max_batch_size, options.workers, options.http_processes) < 1 or not 1024 <= options.port <= 65535:
        raise UsageError("kiln serve: --max_batch_size, --workers and --http_processes take 1 or more, --port 1024 "
                         "to 65535")  # fmt: skip
    model = _exported_from(options)
    info = describe(model, warmed_up(model).spec)  # a model that cannot run stops here, in one line
    api = Served(model, options.max_batch_size, options.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=options.workers, model_metadata=info,
                          max_payload_size=int(options.max_payload_mb * 2**20), middlewares=[JsonBodies],
                          disable_openapi_url=True)  # fmt: skip
    signal.signal(signal.SIGTERM, _stop_on_sigterm(os.getpid()))
    print(f"serving {model} at http://{options.host}:{options.port}/predict (/health, /info)", file=sys.stderr)
    server.run(
        host=options.host,
        port=options.port,
        generate_client_file=False,
        log_level="warning",
        num_api_servers=options.http_processes,
    )
