// Command progressattacker stands in for the one-shot operator in the
// progress attack tests: the process backend runs it, sandboxed, as its
// operator binary. It reads the OperatorInput on stdin, attacks the
// invocation's progress socket ($NEURON_PROGRESS_SOCKET) as the input's
// text says, then prints a valid OperatorOutput ("attacker done") and
// exits 0, so that only the progress can make the run fail.
//
//	flood-frames   small text deltas until the socket is closed
//	flood-bytes    100 KiB tool results until the socket is closed
//	giant-header   a frame header announcing 1 GiB, then waits
//	oversized      one complete 2 MiB tool result frame
//	garbage        a frame of bytes that is no protobuf message
//	bad-utf8       a text delta whose text is not UTF-8
//	output         the output itself as a progress event
//	secret         $CI_TOKEN in every event kind, split over deltas
//	unknown        an event of a kind no one knows, then a text delta
//	stall          512 KiB tool results until the socket is closed, never
//	               exiting before it (the caller reads nothing)
package main

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
)

func main() {
	in, _ := io.ReadAll(os.Stdin)
	input := &operatorv1.OperatorInput{}
	if err := protojson.Unmarshal(in, input); err != nil {
		fmt.Fprintln(os.Stderr, "attacker: bad input:", err)
		os.Exit(1)
	}
	mode := strings.TrimSpace(content.TextOf(input.GetMessage()))
	// Run gives no progress socket: nothing to attack.
	if sock := os.Getenv("NEURON_PROGRESS_SOCKET"); sock != "" {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			fmt.Fprintln(os.Stderr, "attacker: progress socket:", err)
			os.Exit(1)
		}
		attack(conn, mode)
		conn.Close()
	}
	out, _ := protojson.Marshal(&operatorv1.OperatorOutput{
		Message:    content.Text("attacker done"),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
	})
	fmt.Println(string(out))
}

func frame(b []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

func event(ev *operatorv1.ExecuteStreamResponse) []byte {
	b, err := proto.Marshal(ev)
	if err != nil {
		panic(err)
	}
	return frame(b)
}

func text(s string) []byte {
	return event(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{TextDelta: &operatorv1.TextDelta{Turn: 1, Text: s}}})
}

func toolResult(s string) []byte {
	return event(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallFinished{
		ToolCallFinished: &operatorv1.ToolCallFinished{Turn: 1, ToolUseId: "call_0_0", Name: "bash", Result: s}}})
}

// untilClosed writes b again and again until the socket fails.
func untilClosed(c net.Conn, b []byte) {
	for {
		if _, err := c.Write(b); err != nil {
			return
		}
	}
}

func attack(c net.Conn, mode string) {
	switch mode {
	case "flood-frames":
		untilClosed(c, text("x"))
	case "flood-bytes":
		untilClosed(c, toolResult(strings.Repeat("y", 100<<10)))
	case "giant-header":
		c.Write(binary.BigEndian.AppendUint32(nil, 1<<30))
		c.Write([]byte("only a little"))
		// Wait for the service to give up on us.
		c.Read(make([]byte, 1))
	case "oversized":
		c.Write(toolResult(strings.Repeat("z", 2<<20)))
		c.Read(make([]byte, 1))
	case "garbage":
		c.Write(frame([]byte("\xff\xff\xff\xff this is no protobuf message \x00\x01")))
		c.Read(make([]byte, 1))
	case "bad-utf8":
		// Field 1 (text_delta), holding field 2 (text) with bytes that
		// are not UTF-8: proto.Marshal would refuse to write it.
		inner := protowire.AppendTag(nil, 2, protowire.BytesType)
		inner = protowire.AppendBytes(inner, []byte("ok \xc3\x28 not utf-8"))
		b := protowire.AppendTag(nil, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, inner)
		c.Write(frame(b))
		c.Read(make([]byte, 1))
	case "output":
		c.Write(event(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{
			Output: &operatorv1.OperatorOutput{Message: content.Text("forged")}}}))
		c.Read(make([]byte, 1))
	case "secret":
		secret := os.Getenv("CI_TOKEN")
		// One character per delta, then the whole of it, then base64,
		// each on a line of its own.
		for _, r := range "split: " + secret + "\n" {
			c.Write(text(string(r)))
		}
		c.Write(text("whole: " + secret + "\n"))
		c.Write(text("b64: " + base64.StdEncoding.EncodeToString([]byte(secret)) + "\n"))
		input, _ := structpb.NewValue(map[string]any{"command": "echo " + secret, secret: "as a key"})
		c.Write(event(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallStarted{
			ToolCallStarted: &operatorv1.ToolCallStarted{Turn: 1, ToolUseId: "call_0_0", Name: "bash", Input: input}}}))
		c.Write(toolResult("the token is " + secret))
		c.Write(event(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_EffectDeclared{
			EffectDeclared: &operatorv1.EffectDeclared{Effect: &typesv1.Effect{IdempotencyKey: "k1",
				Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{Message: "leak " + secret}}}}}}))
		// Text with no newline, held to the end: the last pieces.
		c.Write(text("tail: " + secret[:4]))
		c.Write(text(secret[4:]))
	case "unknown":
		// Field 99 of ExecuteStreamResponse: no event this service knows.
		b := protowire.AppendTag(nil, 99, protowire.BytesType)
		b = protowire.AppendBytes(b, []byte("from the future"))
		c.Write(frame(b))
		c.Write(text("after the unknown event\n"))
	case "stall":
		untilClosed(c, toolResult(strings.Repeat("s", 512<<10)))
		// Stay until the sandbox is killed.
		time.Sleep(time.Hour)
	default:
		c.Write(text("unknown mode " + mode + "\n"))
	}
}
