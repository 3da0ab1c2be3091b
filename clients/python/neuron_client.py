#!/usr/bin/python3
"""neuron_client.py: a small Python client of the neuron services.

It writes a value to the State service and reads it back, dispatches an
agent through the orchestrator, and reads that workflow's lifecycle
events. Each step prints one JSON line on stdout.

Stubs: generate them from proto/ (with the vendored protovalidate proto)
into a directory and put it on PYTHONPATH. protoc must support proto3
`optional` (3.15 or newer; Debian 12: apt-get install protobuf-compiler
protobuf-compiler-grpc libprotobuf-dev python3-grpcio):

    protoc --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin \\
      -I proto -I third_party/protovalidate \\
      --python_out=gen/python --grpc_python_out=gen/python \\
      buf/validate/validate.proto layer0/types/v1/*.proto \\
      layer0/operator/v1/input.proto layer0/operator/v1/output.proto \\
      layer0/state/v1/state.proto layer0/orchestrator/v1/orchestrator.proto \\
      layer0/lifecycle/v1/lifecycle.proto

(`python3 -m grpc_tools.protoc` with the same flags, minus --plugin, works
too when its bundled protoc is new enough.) Then, against services
started with --dev:

    PYTHONPATH=gen/python /usr/bin/python3 clients/python/neuron_client.py \\
      --state 127.0.0.1:7072 --orchestrator 127.0.0.1:7070

Outside --dev the services want TLS and a bearer token: use
grpc.secure_channel with grpc.composite_channel_credentials(
grpc.ssl_channel_credentials(ca), grpc.access_token_call_credentials(token)).
"""

import argparse
import json
import re
import sys
import uuid

import grpc
from google.protobuf import json_format, struct_pb2

from layer0.lifecycle.v1 import lifecycle_pb2, lifecycle_pb2_grpc
from layer0.operator.v1 import input_pb2, output_pb2
from layer0.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from layer0.state.v1 import state_pb2, state_pb2_grpc
from layer0.types.v1 import content_pb2, scope_pb2

# Observable event types after which a workflow emits nothing more.
TERMINAL_EVENTS = {
    "orchestrator.workflow.completed",
    "orchestrator.workflow.failed",
    "orchestrator.workflow.canceled",
    "orchestrator.workflow.suspended",
}


def emit(step, **fields):
    """Prints one JSON line: the step's name and its fields."""
    print(json.dumps({"step": step, **fields}, sort_keys=True), flush=True)


def to_value(obj):
    """Converts a JSON-compatible Python value to google.protobuf.Value."""
    return json_format.ParseDict(obj, struct_pb2.Value())


def text_of(content):
    """Joins the text blocks of a layer0.types.v1.Content."""
    return "".join(b.text.text for b in content.blocks if b.WhichOneof("block") == "text")


def write_and_read(channel, session, key, value, timeout):
    """Writes value under key in a session scope, then reads it back."""
    stub = state_pb2_grpc.StateServiceStub(channel)
    scope = scope_pb2.Scope(session=scope_pb2.SessionScope(session_id=session))
    written = stub.Write(state_pb2.WriteRequest(scope=scope, key=key, value=to_value(value)), timeout=timeout)
    emit("write", session=session, key=key, value=value, revision=str(written.revision))
    read = stub.Read(state_pb2.ReadRequest(scope=scope, key=key), timeout=timeout)
    emit("read", session=session, key=key, value=json_format.MessageToDict(read.value), revision=str(read.revision))


def dispatch(channel, agent, workflow_id, session, text, timeout):
    """Dispatches agent with one text message and waits for its output.

    The workflow id is chosen here, so a retried Dispatch returns the
    recorded result instead of running the agent twice.
    """
    stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
    message = content_pb2.Content(blocks=[content_pb2.ContentBlock(text=content_pb2.TextBlock(text=text))])
    resp = stub.Dispatch(
        orchestrator_pb2.DispatchRequest(
            agent_id=agent,
            workflow_id=workflow_id,
            input=input_pb2.OperatorInput(message=message, session_id=session),
        ),
        timeout=timeout,
    )
    emit(
        "dispatch",
        workflow_id=resp.workflow_id,
        text=text_of(resp.output.message),
        exit=output_pb2.ExitKind.Name(resp.output.exit_reason.kind),
        provider=resp.output.metadata.provider,
        effects_applied=sum(1 for e in resp.effects if e.applied),
        total_cost=resp.total_cost.amount,
    )
    return resp.workflow_id


# The status message of OUT_OF_RANGE names where the buffer starts.
_OLDEST = re.compile(r"(?:oldest sequence kept|next sequence) is (\d+)")


def events(channel, workflow_id, timeout):
    """Yields the workflow's lifecycle events, replaying those published
    before this call, until the workflow's terminal event or the deadline.

    after_sequence=0 asks for every event still buffered. The orchestrator
    numbers events from a new billion at each start, so 0 is usually older
    than its buffer: it answers OUT_OF_RANGE naming the oldest sequence it
    keeps, and the subscription starts again just before that one.
    """
    stub = lifecycle_pb2_grpc.LifecycleServiceStub(channel)
    after = 0
    for _ in range(5):
        call = stub.Subscribe(
            lifecycle_pb2.SubscribeRequest(workflow_id=workflow_id, after_sequence=after),
            timeout=timeout,
        )
        try:
            for resp in call:
                ev = resp.event
                yield ev
                if ev.WhichOneof("event") == "observable" and ev.observable.event_type in TERMINAL_EVENTS:
                    call.cancel()
                    return
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.OUT_OF_RANGE:
                m = _OLDEST.search(err.details() or "")
                if m:
                    after = int(m.group(1)) - 1
                    continue
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise
    raise RuntimeError("the lifecycle buffer kept moving past after_sequence")


def describe(ev):
    """The event's family and type, e.g. ("observable", "orchestrator.workflow.started")."""
    kind = ev.WhichOneof("event")
    if kind == "observable":
        return kind, ev.observable.event_type
    inner = getattr(ev, kind)
    return kind, inner.WhichOneof("kind") or ""


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state", default="127.0.0.1:7072", help="State service address")
    p.add_argument("--orchestrator", default="127.0.0.1:7070", help="orchestrator address (also serves LifecycleService)")
    p.add_argument("--session", default="python-example", help="session id of the state scope and the dispatch")
    p.add_argument("--key", default="example/greeting", help="state key to write and read")
    p.add_argument("--agent", default="assistant", help="agent id from the orchestrator's registry")
    p.add_argument("--text", default="hello from python", help="message to the agent")
    p.add_argument("--workflow-id", default="", help="workflow id of the dispatch (default: a new one)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds allowed for each call")
    args = p.parse_args(argv)

    workflow_id = args.workflow_id or "py-" + uuid.uuid4().hex
    value = {"greeting": args.text, "client": "python", "tags": ["example", "state"]}
    try:
        with grpc.insecure_channel(args.state) as state_ch, grpc.insecure_channel(args.orchestrator) as orch_ch:
            write_and_read(state_ch, args.session, args.key, value, args.timeout)
            wf = dispatch(orch_ch, args.agent, workflow_id, args.session, args.text, args.timeout)
            n = 0
            for ev in events(orch_ch, wf, args.timeout):
                kind, typ = describe(ev)
                emit("event", sequence=str(ev.sequence), workflow_id=ev.workflow_id, kind=kind, type=typ)
                n += 1
            emit("events", workflow_id=wf, count=n)
    except grpc.RpcError as err:
        print(f"neuron_client: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
