"""A small layer0.state.v1.StateService in Python, for the swap test.

It keeps values in a dict, each with a revision from one counter, and
honours expected_revision, idempotency keys (per scope), prefixes and
paging in List, and a word search. It answers grpc.health.v1 Check for ""
and "layer0.state.v1.StateService". It is a second implementation of the
contract for TestSwapStateImplementations (test/integration/swap_test.go),
not a service to run: nothing survives a restart. The reasons the
contract names (STALE_REVISION, LIMIT_EXCEEDED) travel as a
google.rpc.ErrorInfo in the grpc-status-details-bin trailer, encoded by
hand here so that grpcio-status is not needed.

Usage (the stubs come from protoc with grpc_python_plugin, or
grpc_tools.protoc; see testenv.PythonStubs):

    PYTHONPATH=STUBS /usr/bin/python3 state_server.py --addr 127.0.0.1:7072

Once it listens it prints one JSON line {"msg": "SERVING", "addr": ...} to
stderr, like the Go services. SIGTERM or SIGINT stops it.
"""

import argparse
import base64
import collections
import json
import re
import signal
import sys
import threading
from concurrent import futures

import grpc
from google.protobuf import json_format, struct_pb2

from layer0.state.v1 import state_pb2, state_pb2_grpc

MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = 1 << 20
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_VALUES_PAGE = 2 << 20  # bytes of keys and values in a List page with values
DEFAULT_SEARCH_LIMIT = 10
MAX_SEARCH_LIMIT = 1000
SNIPPET_CHARS = 200

INVALID = grpc.StatusCode.INVALID_ARGUMENT
WORD = re.compile(r"\w+", re.UNICODE)

# The id fields each scope kind needs (types.v1.Scope).
SCOPE_IDS = {
    "session": ("session_id",),
    "workflow": ("workflow_id",),
    "agent": ("workflow_id", "agent_id"),
    "global": (),
    "custom": ("name",),
}


# ErrorInfo.domain of every reason (pkg/errs.Domain).
ERROR_DOMAIN = "layer0.neuron.dev"


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, data):
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(data)) + data


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):
    pass


def abort_with_reason(context, code, message, reason):
    """Aborts with code and message, and a google.rpc.Status holding a
    google.rpc.ErrorInfo {reason, domain} in grpc-status-details-bin."""
    info = field(1, reason.encode()) + field(2, ERROR_DOMAIN.encode())
    detail = field(1, b"type.googleapis.com/google.rpc.ErrorInfo") + field(2, info)
    status = varint(1 << 3) + varint(code.value[0]) + field(2, message.encode("utf-8")) + field(3, detail)
    context.abort_with_status(_Status(code, message, (("grpc-status-details-bin", status),)))


def scope_key(context, scope):
    """Returns the dict key of a scope, or aborts INVALID_ARGUMENT."""
    kind = scope.WhichOneof("kind")
    if kind is None:
        context.abort(INVALID, "scope: a scope kind is required")
    inner = getattr(scope, kind)
    parts = [kind]
    for field in SCOPE_IDS[kind]:
        value = getattr(inner, field)
        if not value:
            context.abort(INVALID, "scope: %s.%s must not be empty" % (kind, field))
        parts.append(value)
    return "\x00".join(parts)


def check_key(context, key):
    if not key:
        context.abort(INVALID, "key must not be empty")
    size = len(key.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        context.abort(INVALID, "key of %d bytes is over the limit of %d bytes" % (size, MAX_KEY_BYTES))


def strings_in(value):
    """Yields every string in a JSON value (from json.loads)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)


class StateService(state_pb2_grpc.StateServiceServicer):
    def __init__(self):
        self.lock = threading.Lock()
        self.revision = 0
        self.values = {}  # (scope, key) -> (Value bytes, revision, JSON text)
        self.replies = {}  # (scope, "write" or "delete", idempotency key) -> (key, result)

    def Read(self, request, context):
        scope = scope_key(context, request.scope)
        check_key(context, request.key)
        with self.lock:
            entry = self.values.get((scope, request.key))
        if entry is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "key %r not found" % request.key)
        return state_pb2.ReadResponse(value=struct_pb2.Value.FromString(entry[0]), revision=entry[1])

    def Write(self, request, context):
        scope = scope_key(context, request.scope)
        check_key(context, request.key)
        if not request.HasField("value"):
            context.abort(INVALID, "value is required")
        text = json_format.MessageToJson(request.value, indent=None)
        size = len(text.encode("utf-8"))
        if size > MAX_VALUE_BYTES:
            abort_with_reason(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "value of %d bytes is over the limit of %d bytes" % (size, MAX_VALUE_BYTES),
                "LIMIT_EXCEEDED",
            )
        replay = (scope, "write", request.idempotency_key)
        with self.lock:
            if request.idempotency_key and replay in self.replies:
                return state_pb2.WriteResponse(revision=self.replayed(context, replay, request.key), replayed=True)
            self.check_revision(context, scope, request)
            self.revision += 1
            self.values[(scope, request.key)] = (request.value.SerializeToString(), self.revision, text)
            if request.idempotency_key:
                self.replies[replay] = (request.key, self.revision)
            return state_pb2.WriteResponse(revision=self.revision)

    def Delete(self, request, context):
        scope = scope_key(context, request.scope)
        check_key(context, request.key)
        replay = (scope, "delete", request.idempotency_key)
        with self.lock:
            if request.idempotency_key and replay in self.replies:
                return state_pb2.DeleteResponse(existed=self.replayed(context, replay, request.key), replayed=True)
            self.check_revision(context, scope, request)
            existed = self.values.pop((scope, request.key), None) is not None
            if request.idempotency_key:
                self.replies[replay] = (request.key, existed)
            return state_pb2.DeleteResponse(existed=existed)

    def replayed(self, context, replay, key):
        """Returns the first result of a retried call, or aborts
        INVALID_ARGUMENT when its idempotency key was used for another key.
        Called with the lock held."""
        first_key, result = self.replies[replay]
        if first_key != key:
            context.abort(INVALID, "idempotency_key %r was used for key %r" % (replay[2], first_key))
        return result

    def check_revision(self, context, scope, request):
        """Aborts FAILED_PRECONDITION unless the key is at the expected
        revision (0: absent). Called with the lock held."""
        if not request.HasField("expected_revision"):
            return
        entry = self.values.get((scope, request.key))
        current = entry[1] if entry else 0
        if request.expected_revision != current:
            abort_with_reason(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "stale revision: key %r is at revision %d, expected %d" % (request.key, current, request.expected_revision),
                "STALE_REVISION",
            )

    def List(self, request, context):
        scope = scope_key(context, request.scope)
        if not 0 <= request.page_size <= MAX_PAGE_SIZE:
            context.abort(INVALID, "page_size must be in 0..%d" % MAX_PAGE_SIZE)
        size = request.page_size or DEFAULT_PAGE_SIZE
        reverse = request.reverse
        after = None
        if request.page_token:
            after = self.decode_token(context, request.page_token, scope, request.prefix, reverse)
        with self.lock:
            keys = sorted(
                (
                    (key, entry[1], entry[0])
                    for (s, key), entry in self.values.items()
                    if s == scope
                    and key.startswith(request.prefix)
                    and (after is None or (key < after if reverse else key > after))
                ),
                reverse=reverse,
            )
        page = []
        total = 0
        for key, revision, value in keys[:size]:
            item = state_pb2.ListItem(key=key, revision=revision)
            if request.include_values:
                # Pages with values hold at most MAX_VALUES_PAGE bytes of
                # keys and values, and always at least one item.
                total += len(key.encode("utf-8")) + len(value)
                if page and total > MAX_VALUES_PAGE:
                    break
                item.value.CopyFrom(struct_pb2.Value.FromString(value))
            page.append(item)
        response = state_pb2.ListResponse(items=page)
        if len(keys) > len(page):
            response.next_page_token = self.encode_token(scope, request.prefix, page[-1].key, reverse)
        return response

    @staticmethod
    def encode_token(scope, prefix, after, reverse):
        raw = json.dumps({"scope": scope, "prefix": prefix, "after": after, "reverse": reverse})
        return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii")

    @staticmethod
    def decode_token(context, token, scope, prefix, reverse):
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8"))
            ok = (
                data["scope"] == scope
                and data["prefix"] == prefix
                and data["reverse"] == reverse
                and isinstance(data["after"], str)
            )
        except (ValueError, KeyError, TypeError, UnicodeError):
            ok = False
        if not ok:
            context.abort(INVALID, "page_token was not issued for this scope, prefix and direction")
        return data["after"]

    def Search(self, request, context):
        scope = scope_key(context, request.scope)
        if not request.query:
            context.abort(INVALID, "query must not be empty")
        if not 0 <= request.limit <= MAX_SEARCH_LIMIT:
            context.abort(INVALID, "limit must be in 0..%d" % MAX_SEARCH_LIMIT)
        if request.mode in (state_pb2.SEARCH_MODE_VECTOR, state_pb2.SEARCH_MODE_HYBRID):
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "this state server has no vector index: it searches keywords only (mode SEARCH_MODE_KEYWORD)",
            )
        terms = set(w.lower() for w in WORD.findall(request.query))
        with self.lock:
            entries = [(key, e[1], e[2]) for (s, key), e in self.values.items() if s == scope]
        results = []
        for key, revision, text in entries:
            score, snippet = 0, ""
            for s in strings_in(json.loads(text)):
                hits = [m for m in WORD.finditer(s) if m.group().lower() in terms]
                if hits and not snippet:
                    start = max(0, hits[0].start() - SNIPPET_CHARS // 2)
                    snippet = s[start : start + SNIPPET_CHARS]
                score += len(hits)
            if score:
                results.append(state_pb2.SearchResult(key=key, score=float(score), snippet=snippet, revision=revision))
        results.sort(key=lambda r: (-r.score, r.key))
        return state_pb2.SearchResponse(results=results[: request.limit or DEFAULT_SEARCH_LIMIT])


def health_handler():
    """grpc.health.v1.Health/Check without the grpcio-health-checking
    package: HealthCheckRequest is {1: service string} and
    HealthCheckResponse {1: status enum}, SERVING = 1."""
    served = {"", "layer0.state.v1.StateService"}

    def parse_service(data):
        i, service = 0, ""
        while i < len(data):
            tag = data[i]
            i += 1
            length, shift = 0, 0
            while True:
                b = data[i]
                i += 1
                length |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    break
            if tag == 0x0A:
                service = data[i : i + length].decode("utf-8")
            i += length
        return service

    def check(service, context):
        if service not in served:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service %r" % service)
        return 1

    handler = grpc.unary_unary_rpc_method_handler(
        check,
        request_deserializer=parse_service,
        response_serializer=lambda status: bytes([0x08, status]),
    )
    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": handler})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:7072", help="listen address, host:port")
    args = parser.parse_args()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    state_pb2_grpc.add_StateServiceServicer_to_server(StateService(), server)
    server.add_generic_rpc_handlers((health_handler(),))
    port = server.add_insecure_port(args.addr)
    if port == 0:
        print("state_server.py: cannot listen on %s" % args.addr, file=sys.stderr)
        return 1
    server.start()
    host = args.addr.rsplit(":", 1)[0]
    print(json.dumps({"level": "INFO", "msg": "SERVING", "service": "state-python", "addr": "%s:%d" % (host, port)}), file=sys.stderr, flush=True)

    stopped = threading.Event()

    def stop(signum, frame):
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopped.wait(0.5):
        pass
    server.stop(grace=2).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
