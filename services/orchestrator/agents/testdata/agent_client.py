#!/usr/bin/python3
"""agent_client.py: defines an agent through AgentService and runs it.

It creates an agent with its own instructions, routed to an operator
service, reads it back, changes it with UpdateAgent (the revision it read
as the expected one), shows that a stale update is refused, and
dispatches the agent through the orchestrator. Each step prints one JSON
line on stdout. agents_test.go (TestPythonClient) runs it; stubs are
generated from proto/ as clients/python/neuron_client.py says, with
layer0/agent/v1/agent.proto and layer0/environment/v1/environment.proto
added.

    PYTHONPATH=gen/python /usr/bin/python3 agent_client.py \\
      --orchestrator 127.0.0.1:7070 --operator 127.0.0.1:7071 --name py-helper
"""

import argparse
import json
import sys

import grpc

from layer0.agent.v1 import agent_pb2, agent_pb2_grpc
from layer0.operator.v1 import input_pb2
from layer0.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from layer0.types.v1 import content_pb2


def emit(step, **fields):
    """Prints one JSON line: the step's name and its fields."""
    print(json.dumps({"step": step, **fields}, sort_keys=True), flush=True)


def text_of(content):
    """Joins the text blocks of a layer0.types.v1.Content."""
    return "".join(b.text.text for b in content.blocks if b.WhichOneof("block") == "text")


def definition(operator, instructions):
    """An agent definition running on the operator at that address."""
    return agent_pb2.AgentDefinition(
        description="defined from Python",
        labels={"client": "python"},
        instructions=instructions,
        limits=agent_pb2.Limits(max_turns=4),
        route=agent_pb2.Route(operator=agent_pb2.OperatorRoute(address=operator)),
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--orchestrator", required=True)
    p.add_argument("--operator", required=True)
    p.add_argument("--name", default="py-helper")
    p.add_argument("--text", default="hello from python")
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args()

    with grpc.insecure_channel(args.orchestrator) as ch:
        agents = agent_pb2_grpc.AgentServiceStub(ch)
        created = agents.CreateAgent(
            agent_pb2.CreateAgentRequest(agent=agent_pb2.Agent(name=args.name, definition=definition(args.operator, "You are terse."))),
            timeout=args.timeout).agent
        emit("create", name=created.name, revision=str(created.revision))

        got = agents.GetAgent(agent_pb2.GetAgentRequest(name=args.name), timeout=args.timeout).agent
        emit("get", name=got.name, revision=str(got.revision), instructions=got.definition.instructions)

        updated = agents.UpdateAgent(agent_pb2.UpdateAgentRequest(
            agent=agent_pb2.Agent(name=args.name, definition=definition(args.operator, "You are very terse.")),
            expected_revision=got.revision), timeout=args.timeout).agent
        emit("update", revision=str(updated.revision), instructions=updated.definition.instructions)

        try:
            agents.UpdateAgent(agent_pb2.UpdateAgentRequest(
                agent=agent_pb2.Agent(name=args.name, definition=definition(args.operator, "stale")),
                expected_revision=got.revision), timeout=args.timeout)
            emit("stale_update", code="OK")
        except grpc.RpcError as e:
            emit("stale_update", code=e.code().name)

        try:
            bad = definition(args.operator, "x")
            bad.tools.builtin.append("teleport")
            agents.CreateAgent(agent_pb2.CreateAgentRequest(agent=agent_pb2.Agent(name=args.name + "-bad", definition=bad)), timeout=args.timeout)
            emit("bad_create", code="OK")
        except grpc.RpcError as e:
            emit("bad_create", code=e.code().name, message=e.details())

        listed = agents.ListAgents(agent_pb2.ListAgentsRequest(label_selector={"client": "python"}), timeout=args.timeout)
        emit("list", names=[a.name for a in listed.agents])

        orch = orchestrator_pb2_grpc.OrchestratorServiceStub(ch)
        resp = orch.Dispatch(orchestrator_pb2.DispatchRequest(
            agent_id=args.name,
            input=input_pb2.OperatorInput(
                trigger=input_pb2.TRIGGER_TYPE_USER,
                message=content_pb2.Content(blocks=[content_pb2.ContentBlock(text=content_pb2.TextBlock(text=args.text))]),
            )), timeout=args.timeout)
        emit("dispatch", workflow_id=resp.workflow_id, text=text_of(resp.output.message))
    return 0


if __name__ == "__main__":
    sys.exit(main())
