package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc/codes"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// transcriptPage is how many steps one GetTranscript call asks for.
const transcriptPage = 20

// resultLines bounds the lines of a tool result the transcript prints;
// --json prints all of it.
const resultLines = 20

// showTranscript is `neuron workflows show ID --transcript`: the record,
// then every step of the transcript, paged through GetTranscript.
func (c *cli) showTranscript(ctx context.Context, client orchestratorv1.OrchestratorServiceClient, cn *conn, id string) error {
	if !cn.json {
		if err := c.showWorkflow(ctx, client, cn, id); err != nil {
			return err
		}
		fmt.Fprintln(c.stdout, "\ntranscript:")
	}
	cn.hints = map[codes.Code]string{
		codes.NotFound:    "no transcript is kept for this workflow (`neuron workflows list` shows the workflows there are)",
		codes.Unavailable: "the orchestrator reads transcripts from the State service: is it running?",
	}
	token, n := "", 0
	for {
		resp, err := client.GetTranscript(ctx, &orchestratorv1.GetTranscriptRequest{WorkflowId: id, PageSize: transcriptPage, PageToken: token})
		if err != nil {
			return cn.wrap(err)
		}
		for _, s := range resp.GetSteps() {
			n++
			if cn.json {
				printJSONLine(c.stdout, s)
			} else {
				printStep(c.stdout, s)
			}
		}
		token = resp.GetNextPageToken()
		if token == "" {
			break
		}
	}
	if n == 0 && !cn.json {
		fmt.Fprintln(c.stdout, "  (no steps recorded)")
	}
	return nil
}

// printStep writes one transcript step for a person, indented by its
// delegation depth.
func printStep(w io.Writer, s *orchestratorv1.TranscriptStep) {
	ind := "  " + strings.Repeat("    ", int(s.GetDepth()))
	head := fmt.Sprintf("step %d · %s", s.GetStep(), s.GetAgentId())
	if s.GetDepth() > 0 {
		head += fmt.Sprintf(" (depth %d", s.GetDepth())
		if p := s.GetParentDispatchId(); p != "" {
			head += ", for " + p
		}
		head += ")"
	}
	head += " · " + s.GetDispatchId()
	if st, et := s.GetStartTime(), s.GetEndTime(); st != nil && et != nil {
		head += fmt.Sprintf(" · %.1fs", et.AsTime().Sub(st.AsTime()).Seconds())
	}
	fmt.Fprintf(w, "\n%s%s\n", ind, head)
	in := s.GetInput()
	trigger := strings.TrimPrefix(in.GetTrigger().String(), "TRIGGER_TYPE_")
	block(w, ind+"  ", "input ("+trigger+")", content.TextOf(in.GetMessage()), 0)
	for _, tc := range s.GetToolCalls() {
		fmt.Fprintf(w, "%s  → %s(%s)  [%s]\n", ind, tc.GetName(), jsonText(tc.GetInput()), tc.GetToolUseId())
		label := fmt.Sprintf("← result, %d bytes", tc.GetResultBytes())
		if tc.GetIsError() {
			label = fmt.Sprintf("← error, %d bytes", tc.GetResultBytes())
		}
		if d := tc.GetDuration(); d != nil {
			label += fmt.Sprintf(", %.1fs", d.AsDuration().Seconds())
		}
		if tc.GetTruncated() {
			label += ", cut at 64 KiB"
		}
		block(w, ind+"    ", label, tc.GetResult(), resultLines)
	}
	if out := s.GetOutput(); out != nil {
		exit := strings.TrimPrefix(out.GetExitReason().GetKind().String(), "EXIT_KIND_")
		block(w, ind+"  ", "output ("+exit+")", content.TextOf(out.GetMessage()), 0)
	}
	if e := s.GetError(); e != nil {
		fmt.Fprintf(w, "%s  error: %s: %s\n", ind, codeName(codes.Code(uint32(e.GetCode()))), oneLine(e.GetMessage()))
	}
}

// block writes a label and text under it, indented; max > 0 keeps that
// many lines and says how many more there were.
func block(w io.Writer, ind, label, text string, max int) {
	text = strings.TrimRight(text, "\n ")
	if text == "" {
		fmt.Fprintf(w, "%s%s: (empty)\n", ind, label)
		return
	}
	fmt.Fprintf(w, "%s%s:\n", ind, label)
	lines := strings.Split(text, "\n")
	more := 0
	if max > 0 && len(lines) > max {
		lines, more = lines[:max], len(lines)-max
	}
	for _, l := range lines {
		fmt.Fprintf(w, "%s  %s\n", ind, l)
	}
	if more > 0 {
		fmt.Fprintf(w, "%s  … %d more line(s) (--json prints all of it)\n", ind, more)
	}
}
