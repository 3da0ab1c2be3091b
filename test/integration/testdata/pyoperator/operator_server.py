"""A small layer0.operator.v1.OperatorService in Python, for the swap test.

It is a second implementation of the operator contract, written without
any of the Go code: its own ReAct loop over an OpenAI-compatible Chat
Completions server (--model-base-url, --model), one tool, write_memory,
which declares a WriteMemory effect (it never writes state itself), and
the limits max_turns, max_cost and max_duration, the caller's deadline,
tool approvals with signed resume tokens, Execute and ExecuteStream. It
keeps no session history: session_id is accepted and otherwise unused.

When an input's metadata holds "scripted" (the conformance suite's
scripted model, pkg/conformance/operator), the script's turns answer
instead of the model server: text, tool_calls (arguments or
raw_arguments), usage, cost, delay and stop, played by the number of
assistant turns of the invocation, so a resumed invocation goes on where
the suspended one stopped.

Errors carry the reasons the contract names (OPERATOR_RETRYABLE,
OPERATOR_NON_RETRYABLE) as a google.rpc.ErrorInfo in the
grpc-status-details-bin trailer, encoded by hand so that grpcio-status is
not needed. It answers grpc.health.v1 Check for "" and the service.

Usage (the stubs come from protoc with grpc_python_plugin, or
grpc_tools.protoc; see testenv.PythonStubs):

    PYTHONPATH=STUBS /usr/bin/python3 operator_server.py --addr 127.0.0.1:7071 \
        [--model-base-url http://HOST:PORT/v1 --model NAME] [--circuit-breaker N]

Once it listens it prints one JSON line {"msg": "SERVING", "addr": ...} to
stderr, like the Go services. SIGTERM or SIGINT stops it.
"""

import argparse
import base64
import collections
import decimal
import hashlib
import hmac
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent import futures

import grpc
from google.protobuf import duration_pb2, json_format, struct_pb2

from layer0.operator.v1 import input_pb2, operator_pb2, operator_pb2_grpc, output_pb2
from layer0.types.v1 import content_pb2, effect_pb2, money_pb2, scope_pb2

SERVICE = "layer0.operator.v1.OperatorService"
ERROR_DOMAIN = "layer0.neuron.dev"  # ErrorInfo.domain (pkg/errs.Domain)
RETRYABLE = "OPERATOR_RETRYABLE"
NON_RETRYABLE = "OPERATOR_NON_RETRYABLE"
INVALID = grpc.StatusCode.INVALID_ARGUMENT

DEFAULT_MAX_TURNS = 25
DEFAULT_MAX_DURATION = 600.0  # seconds
DEADLINE_MARGIN = 0.5  # seconds: answer TIMEOUT this long before the caller's deadline
TOOL = "write_memory"
SCOPES = ("session", "workflow", "agent", "global")
TOOL_SPEC = {
    "type": "function",
    "function": {
        "name": TOOL,
        "description": "Store a value in memory under a key. The write is carried out after your turn ends.",
        "parameters": {
            "type": "object",
            "properties": {
                "key": {"type": "string", "minLength": 1},
                "value": {"description": "Any JSON value."},
                "scope": {"type": "string", "enum": list(SCOPES)},
            },
            "required": ["key", "value"],
            "additionalProperties": False,
        },
    },
}


# --- errors -----------------------------------------------------------------


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


class Failure(Exception):
    """Ends an invocation with a gRPC status (and an ErrorInfo reason)."""

    def __init__(self, code, message, reason=""):
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason

    def abort(self, context):
        if not self.reason:
            context.abort(self.code, self.message)
        info = field(1, self.reason.encode()) + field(2, ERROR_DOMAIN.encode())
        detail = field(1, b"type.googleapis.com/google.rpc.ErrorInfo") + field(2, info)
        st = varint(1 << 3) + varint(self.code.value[0]) + field(2, self.message.encode("utf-8")) + field(3, detail)
        context.abort_with_status(_Status(self.code, self.message, (("grpc-status-details-bin", st),)))


class Cancelled(Exception):
    """The caller went away."""


# --- values -----------------------------------------------------------------


def money(d):
    """A Decimal as a Money amount: digits, a point and digits, no exponent."""
    s = format(d.normalize(), "f") if d else "0"
    return money_pb2.Money(amount=s)


def parse_money(m, what):
    if not m.amount:
        return decimal.Decimal(0)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", m.amount):
        raise Failure(INVALID, "%s: %r is not a decimal amount such as 0.25" % (what, m.amount))
    return decimal.Decimal(m.amount)


def to_value(obj):
    v = struct_pb2.Value()
    json_format.ParseDict(obj, v)
    return v


def text_of(content):
    return "\n".join(b.text.text for b in content.blocks if b.WhichOneof("block") == "text")


def words(text):
    """The text in chunks of a word and the whitespace after it."""
    return re.findall(r"\s*\S+\s*|\s+", text)


# --- models -----------------------------------------------------------------


class Reply:
    """One model answer: text, tool calls [(id, name, raw arguments)],
    the stop reason, usage and cost."""

    def __init__(self, text, calls, stop, tokens_in, tokens_out, cost, model):
        self.text, self.calls, self.stop = text, calls, stop
        self.tokens_in, self.tokens_out, self.cost, self.model = tokens_in, tokens_out, cost, model


class ScriptedModel:
    """Plays a script of turns (the format of the Go scripted model, the
    subset the conformance suite uses)."""

    name = "scripted"
    provider = "scripted"

    def __init__(self, script):
        turns = script.get("turns") if isinstance(script, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
            raise Failure(INVALID, 'metadata "scripted": want an object with a non-empty list of "turns"')
        self.turns = turns

    def call(self, messages, turn_index, wait):
        if turn_index >= len(self.turns):
            t = {"text": "[scripted model: script exhausted after %d turns]" % len(self.turns)}
        else:
            t = self.turns[turn_index]
        delay = parse_delay(t.get("delay"))
        if delay:
            wait(delay)
        calls = []
        for i, c in enumerate(t.get("tool_calls") or []):
            if "raw_arguments" in c:
                raw = c["raw_arguments"]
            else:
                raw = json.dumps(c.get("arguments", {}))
            calls.append(("call_%d_%d" % (turn_index, i), c.get("name", ""), raw))
        text = t.get("text", "")
        stop = t.get("stop") or ("tool_use" if calls else "end_turn")
        u = t.get("usage") or {}
        tin = int(u.get("input_tokens", max(1, (sum(len(json.dumps(m)) for m in messages) + 3) // 4)))
        tout = int(u.get("output_tokens", max(1, (len(text) + sum(len(c[2]) for c in calls) + 3) // 4)))
        cost = decimal.Decimal(str(t.get("cost", "0")))
        return Reply(text, calls, stop, tin, tout, cost, "scripted")


def parse_delay(s):
    if not s:
        return 0.0
    m = re.fullmatch(r"([0-9.]+)(ms|s|m)", str(s))
    if not m:
        raise Failure(INVALID, 'metadata "scripted": delay %r is not a duration such as "250ms"' % s)
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2)]


class ChatModel:
    """An OpenAI-compatible Chat Completions server."""

    provider = "openai-compatible"

    def __init__(self, base_url, name):
        self.base_url, self.name = base_url.rstrip("/"), name

    def call(self, messages, turn_index, wait):
        if not self.base_url:
            raise Failure(grpc.StatusCode.FAILED_PRECONDITION, "no model server: start with --model-base-url", NON_RETRYABLE)
        body = json.dumps({"model": self.name, "messages": messages, "tools": [TOOL_SPEC]}).encode()
        req = urllib.request.Request(self.base_url + "/chat/completions", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                answer = json.load(resp)
        except urllib.error.HTTPError as e:
            code = grpc.StatusCode.UNAVAILABLE if e.code == 429 or e.code >= 500 else grpc.StatusCode.FAILED_PRECONDITION
            raise Failure(code, "model server answered %d: %s" % (e.code, e.read(512).decode("utf-8", "replace")),
                          RETRYABLE if code == grpc.StatusCode.UNAVAILABLE else NON_RETRYABLE)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise Failure(grpc.StatusCode.UNAVAILABLE, "model server: %s" % e, RETRYABLE)
        choice = (answer.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        calls = [(c.get("id", ""), c.get("function", {}).get("name", ""), c.get("function", {}).get("arguments", "{}"))
                 for c in msg.get("tool_calls") or []]
        finish = choice.get("finish_reason")
        stop = {"length": "max_tokens", "content_filter": "content_filter"}.get(finish, "tool_use" if calls else "end_turn")
        usage = answer.get("usage") or {}
        return Reply(msg.get("content") or "", calls, stop, int(usage.get("prompt_tokens", 0)),
                     int(usage.get("completion_tokens", 0)), decimal.Decimal(0), answer.get("model") or self.name)


# --- resume tokens ----------------------------------------------------------


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


class Tokens:
    """Signs and checks resume tokens: pyop1.<base64url(JSON)>.<base64url(HMAC-SHA256)>."""

    def __init__(self, key):
        self.key = key

    def sign(self, state):
        body = b64(json.dumps(state, separators=(",", ":")).encode())
        mac = hmac.new(self.key, ("pyop1." + body).encode(), hashlib.sha256).digest()
        return "pyop1.%s.%s" % (body, b64(mac))

    def open(self, token):
        parts = token.split(".")
        bad = Failure(INVALID, "resume.resume_token: not a token this operator issued, or altered; resume with the token of the suspended output")
        if len(parts) != 3 or parts[0] != "pyop1":
            raise bad
        try:
            mac = unb64(parts[2])
        except ValueError:
            raise bad
        want = hmac.new(self.key, ("pyop1." + parts[1]).encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(mac, want):
            raise bad
        return json.loads(unb64(parts[1]))


# --- the loop ---------------------------------------------------------------


class Invocation:
    """One invocation: yields ExecuteStreamResponse events, the output last."""

    def __init__(self, server, inp, context):
        self.server, self.inp, self.context = server, inp, context
        self.start = time.monotonic()
        self.check()
        cfg = inp.config
        self.max_turns = cfg.max_turns if cfg.HasField("max_turns") else DEFAULT_MAX_TURNS
        self.max_cost = parse_money(cfg.max_cost, "config.max_cost") if cfg.HasField("max_cost") and cfg.max_cost.amount else None
        self.max_duration = cfg.max_duration.ToTimedelta().total_seconds() if cfg.HasField("max_duration") else DEFAULT_MAX_DURATION
        self.approvals = dict(cfg.tool_approvals)
        md = json_format.MessageToDict(inp.metadata) if inp.HasField("metadata") else {}
        if "scripted" in md:
            script = md["scripted"]
            if isinstance(script, str):
                try:
                    script = json.loads(script)
                except ValueError as e:
                    raise Failure(INVALID, 'metadata "scripted": not JSON: %s' % e)
            self.model = ScriptedModel(script)
        else:
            self.model = server.chat
        self.dispatch = inp.dispatch.dispatch_id or "pyop-" + uuid.uuid4().hex
        self.messages = []
        self.turns = 0
        self.tokens_in = self.tokens_out = 0
        self.cost = decimal.Decimal(0)
        self.effect_n = 0
        self.failures = 0
        self.effects = []
        self.subs = []
        self.text = ""
        self.finished = False

    def check(self):
        inp, cfg = self.inp, self.inp.config
        if not inp.HasField("message"):
            raise Failure(INVALID, "input.message: required; give the message, task or signal to act on")
        if inp.trigger == input_pb2.TRIGGER_TYPE_CUSTOM and not inp.custom_trigger:
            raise Failure(INVALID, "input.custom_trigger: required when trigger is TRIGGER_TYPE_CUSTOM")
        if cfg.HasField("max_turns") and cfg.max_turns < 1:
            raise Failure(INVALID, "config.max_turns: must be at least 1")
        if cfg.HasField("model") and cfg.model not in ("scripted", self.server.chat.name):
            raise Failure(INVALID, "config.model: unknown model %r; this operator serves %r and \"scripted\"" % (cfg.model, self.server.chat.name))
        if cfg.HasField("allowed_tools"):
            for n in cfg.allowed_tools.names:
                if n != TOOL:
                    raise Failure(INVALID, "config.allowed_tools: unknown tool %r; this operator has only %s" % (n, TOOL))
        if cfg.HasField("max_duration") and cfg.max_duration.ToTimedelta().total_seconds() <= 0:
            raise Failure(INVALID, "config.max_duration: must be positive")
        if inp.HasField("resume") and not inp.resume.resume_token:
            raise Failure(INVALID, "resume.resume_token: required")

    # time

    def remaining(self):
        left = self.max_duration - (time.monotonic() - self.start)
        caller = self.context.time_remaining()
        if caller is not None:
            left = min(left, caller - DEADLINE_MARGIN)
        return left

    def wait(self, seconds):
        """Sleeps, or raises TimeoutError when the limits run out first,
        Cancelled when the caller goes away."""
        end = time.monotonic() + seconds
        while True:
            if not self.context.is_active():
                raise Cancelled()
            now = time.monotonic()
            if now >= end:
                return
            left = self.remaining()
            if left <= 0:
                raise TimeoutError()
            time.sleep(min(0.05, end - now, left))

    # the loop

    def run(self):
        if self.inp.HasField("resume"):
            yield from self.resume()
            if self.finished:
                return
        else:
            self.messages.append({"role": "user", "content": text_of(self.inp.message)})
        while True:
            if self.remaining() <= 0:
                yield self.output(output_pb2.EXIT_KIND_TIMEOUT, "", "max_duration or the caller's deadline ran out")
                return
            try:
                reply = self.model.call(self.messages, self.turns, self.wait)
            except TimeoutError:
                yield self.output(output_pb2.EXIT_KIND_TIMEOUT, "", "max_duration or the caller's deadline ran out")
                return
            self.turns += 1
            turn = self.turns
            for w in words(reply.text):
                yield operator_pb2.ExecuteStreamResponse(text_delta=operator_pb2.TextDelta(turn=turn, text=w))
            self.tokens_in += reply.tokens_in
            self.tokens_out += reply.tokens_out
            self.cost += reply.cost
            yield operator_pb2.ExecuteStreamResponse(model_call_finished=operator_pb2.ModelCallFinished(
                turn=turn, model=reply.model, tokens_in=reply.tokens_in, tokens_out=reply.tokens_out,
                cost=money(reply.cost), cumulative_cost=money(self.cost)))
            if reply.stop in ("max_tokens", "content_filter"):
                raise Failure(grpc.StatusCode.FAILED_PRECONDITION,
                              "the model's reply was cut (%s); a retry will not help: raise the output limit or change the request" % reply.stop,
                              NON_RETRYABLE)
            self.text = reply.text
            assistant = {"role": "assistant", "content": reply.text or None}
            if reply.calls:
                assistant["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in reply.calls]
            self.messages.append(assistant)
            if not reply.calls:
                yield self.output(output_pb2.EXIT_KIND_COMPLETE)
                return
            waiting = [c for c in reply.calls if self.needs_approval(c[1])]
            if waiting:
                yield self.suspend(reply.calls, waiting, turn)
                return
            for c in reply.calls:
                yield from self.call_tool(turn, c[0], c[1], c[2])
            end = self.exit_check()
            if end:
                yield end
                return

    def needs_approval(self, name):
        a = self.approvals.get(name, self.approvals.get("*", input_pb2.TOOL_APPROVAL_UNSPECIFIED))
        # write_memory is an effect tool, never read-only.
        return a in (input_pb2.TOOL_APPROVAL_ALWAYS, input_pb2.TOOL_APPROVAL_UNLESS_READ_ONLY)

    def exit_check(self):
        if self.server.breaker and self.failures >= self.server.breaker:
            return self.output(output_pb2.EXIT_KIND_CIRCUIT_BREAKER, "", "%d consecutive tool calls failed" % self.failures)
        if self.max_cost is not None and self.cost >= self.max_cost:
            return self.output(output_pb2.EXIT_KIND_BUDGET_EXHAUSTED, "", "cost %s reached max_cost %s" % (self.cost, self.max_cost))
        if self.turns >= self.max_turns:
            return self.output(output_pb2.EXIT_KIND_MAX_TURNS, "", "max_turns %d used" % self.max_turns)
        return None

    def call_tool(self, turn, call_id, name, raw, rejected=None):
        began = time.monotonic()
        effect = None
        if rejected is not None:
            result, failed = "Rejected: %s" % rejected, True
        else:
            parsed = None
            try:
                parsed = json.loads(raw)
            except ValueError:
                pass
            yield operator_pb2.ExecuteStreamResponse(tool_call_started=operator_pb2.ToolCallStarted(
                turn=turn, tool_use_id=call_id, name=name, input=to_value(parsed if isinstance(parsed, dict) else {})))
            result, failed, effect = self.write_memory(name, parsed)
        took = duration_pb2.Duration()
        took.FromNanoseconds(int((time.monotonic() - began) * 1e9))
        if effect is not None:
            self.effects.append(effect)
            yield operator_pb2.ExecuteStreamResponse(effect_declared=operator_pb2.EffectDeclared(effect=effect))
        yield operator_pb2.ExecuteStreamResponse(tool_call_finished=operator_pb2.ToolCallFinished(
            turn=turn, tool_use_id=call_id, name=name, result=result, is_error=failed, duration=took))
        self.subs.append(output_pb2.SubDispatchRecord(name=name, duration=took, success=not failed, error=result if failed else ""))
        if rejected is None:
            self.failures = self.failures + 1 if failed else 0
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})

    def write_memory(self, name, args):
        """Returns (result, failed, effect) of one write_memory call."""
        if name != TOOL:
            return "unknown tool %r; the only tool is %s" % (name, TOOL), True, None
        if not isinstance(args, dict):
            return "arguments must be a JSON object {\"key\": ..., \"value\": ...}", True, None
        key, scope = args.get("key"), args.get("scope", "session")
        if not isinstance(key, str) or not key or "value" not in args:
            return "\"key\" (a non-empty string) and \"value\" are required", True, None
        d = self.inp.dispatch
        if scope == "workflow" and d.workflow_id:
            sc = scope_pb2.Scope(workflow=scope_pb2.WorkflowScope(workflow_id=d.workflow_id))
        elif scope == "agent" and d.workflow_id and d.agent_id:
            sc = scope_pb2.Scope(agent=scope_pb2.AgentScope(workflow_id=d.workflow_id, agent_id=d.agent_id))
        elif scope == "session" and self.inp.HasField("session_id"):
            sc = scope_pb2.Scope(session=scope_pb2.SessionScope(session_id=self.inp.session_id))
        elif scope == "global":
            sc = scope_pb2.Scope(**{"global": scope_pb2.GlobalScope()})
        else:
            return "scope %r cannot be used by this invocation" % scope, True, None
        self.effect_n += 1
        effect = effect_pb2.Effect(idempotency_key="%s/effect/%d" % (self.dispatch, self.effect_n),
                                   write_memory=effect_pb2.WriteMemory(scope=sc, key=key, value=to_value(args["value"])))
        return "Memory written.", False, effect

    def suspend(self, calls, waiting, turn):
        state = {
            "messages": self.messages, "turns": self.turns, "effect_n": self.effect_n, "failures": self.failures,
            "calls": [list(c) for c in calls], "waiting": [c[0] for c in waiting], "turn": turn,
            "session": self.inp.session_id if self.inp.HasField("session_id") else None, "text": self.text,
        }
        pending = []
        for c in waiting:
            try:
                args = json.loads(c[2])
            except ValueError:
                args = {}
            pending.append(output_pb2.PendingToolCall(tool_use_id=c[0], name=c[1], input=to_value(args), reason="policy", turn=turn))
        out = self.output(output_pb2.EXIT_KIND_SUSPENDED, "", "waiting for approval of %d tool call(s)" % len(waiting))
        out.output.exit_reason.suspension.CopyFrom(output_pb2.Suspension(
            resume_token=self.server.tokens.sign(state), prompt="Approve the tool calls?", tool_calls=pending))
        return out

    def resume(self):
        state = self.server.tokens.open(self.inp.resume.resume_token)
        session = self.inp.session_id if self.inp.HasField("session_id") else None
        if session != state["session"]:
            raise Failure(INVALID, "input.session_id: differs from the suspended invocation's")
        decisions = {}
        for d in self.inp.resume.tool_decisions:
            if d.tool_use_id in decisions:
                raise Failure(INVALID, "resume.tool_decisions: %r decided twice" % d.tool_use_id)
            if d.tool_use_id not in state["waiting"]:
                raise Failure(INVALID, "resume.tool_decisions: %r is not a call waiting for approval" % d.tool_use_id)
            decisions[d.tool_use_id] = d
        for w in state["waiting"]:
            if w not in decisions:
                raise Failure(INVALID, "resume.tool_decisions: no decision on the waiting call %r" % w)
        self.messages, self.turns = state["messages"], state["turns"]
        self.effect_n, self.failures, self.text = state["effect_n"], state["failures"], state["text"]
        for call_id, name, raw in state["calls"]:
            d = decisions.get(call_id)
            if d is not None and not d.approved:
                yield from self.call_tool(state["turn"], call_id, name, raw,
                                          rejected="%s did not approve this call. Reason: %s" % (d.decided_by or "a person", d.reason or "none given"))
                continue
            if d is not None and d.HasField("edited_input"):
                raw = json.dumps(json_format.MessageToDict(d.edited_input))
            yield from self.call_tool(state["turn"], call_id, name, raw)
        end = self.exit_check()
        if end:
            self.finished = True
            yield end

    def output(self, kind, text=None, message=""):
        took = duration_pb2.Duration()
        took.FromNanoseconds(int((time.monotonic() - self.start) * 1e9))
        text = getattr(self, "text", "") if text is None else text
        out = output_pb2.OperatorOutput(
            message=content_pb2.Content(blocks=[content_pb2.ContentBlock(text=content_pb2.TextBlock(text=text))]),
            exit_reason=output_pb2.ExitReason(kind=kind, message=message),
            metadata=output_pb2.OperatorMetadata(
                tokens_in=self.tokens_in, tokens_out=self.tokens_out, cost=money(self.cost), turns_used=self.turns,
                sub_dispatches=self.subs, duration=took, model=getattr(self.model, "name", ""), provider=self.model.provider),
            effects=self.effects)
        return operator_pb2.ExecuteStreamResponse(output=out)


class OperatorService(operator_pb2_grpc.OperatorServiceServicer):
    def __init__(self, chat, breaker, tokens):
        self.chat, self.breaker, self.tokens = chat, breaker, tokens

    def events(self, request, context):
        if not request.HasField("input"):
            raise Failure(INVALID, "input: required")
        inv = Invocation(self, request.input, context)
        for ev in inv.run():
            yield ev
            if ev.HasField("output"):
                return

    def Execute(self, request, context):
        try:
            for ev in self.events(request, context):
                if ev.HasField("output"):
                    return operator_pb2.ExecuteResponse(output=ev.output)
        except Failure as f:
            f.abort(context)
        except Cancelled:
            context.abort(grpc.StatusCode.CANCELLED, "the caller cancelled")
        raise RuntimeError("the loop ended without an output")

    def ExecuteStream(self, request, context):
        try:
            yield from self.events(request, context)
        except Failure as f:
            f.abort(context)
        except Cancelled:
            context.abort(grpc.StatusCode.CANCELLED, "the caller cancelled")


def health_handler():
    """grpc.health.v1.Health/Check without the grpcio-health-checking
    package: HealthCheckRequest is {1: service string} and
    HealthCheckResponse {1: status enum}, SERVING = 1."""
    served = {"", SERVICE}

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
        check, request_deserializer=parse_service, response_serializer=lambda status: bytes([0x08, status]))
    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": handler})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:7071", help="listen address, host:port")
    parser.add_argument("--model-base-url", default="", help="OpenAI-compatible API base URL, such as http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default="local", help="the model name sent to the model server")
    parser.add_argument("--circuit-breaker", type=int, default=5, help="consecutive failed tool calls that end the loop; 0: never")
    parser.add_argument("--resume-key-hex", default=os.environ.get("PYOP_RESUME_KEY", ""), help="resume token key (hex); default: random per process")
    args = parser.parse_args()
    key = bytes.fromhex(args.resume_key_hex) if args.resume_key_hex else os.urandom(32)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    operator_pb2_grpc.add_OperatorServiceServicer_to_server(
        OperatorService(ChatModel(args.model_base_url, args.model), args.circuit_breaker, Tokens(key)), server)
    server.add_generic_rpc_handlers((health_handler(),))
    port = server.add_insecure_port(args.addr)
    if port == 0:
        print("operator_server.py: cannot listen on %s" % args.addr, file=sys.stderr)
        return 1
    server.start()
    host = args.addr.rsplit(":", 1)[0]
    print(json.dumps({"level": "INFO", "msg": "SERVING", "service": "operator-python", "addr": "%s:%d" % (host, port)}), file=sys.stderr, flush=True)

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
