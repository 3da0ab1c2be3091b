package openairesponses

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/openai/openai-go/v3/responses"
)

// streamItem is an output item being assembled from stream events.
type streamItem struct {
	kind         string
	callID, name string
	args         strings.Builder
	parts        map[int64]*streamPart
	// done is the complete item of response.output_item.done, which
	// supersedes the deltas.
	done *outItem
}

type streamPart struct {
	text    strings.Builder
	refusal bool
}

func (it *streamItem) part(i int64) *streamPart {
	if it.kind == "" {
		it.kind = "message"
	}
	if it.parts == nil {
		it.parts = make(map[int64]*streamPart)
	}
	sp, ok := it.parts[i]
	if !ok {
		sp = &streamPart{}
		it.parts[i] = sp
	}
	return sp
}

func (it *streamItem) outItem() outItem {
	if it.done != nil {
		return *it.done
	}
	o := outItem{kind: it.kind, callID: it.callID, name: it.name, args: it.args.String()}
	for _, i := range slices.Sorted(maps.Keys(it.parts)) {
		sp := it.parts[i]
		o.texts = append(o.texts, sp.text.String())
		o.refusal = o.refusal || sp.refusal
	}
	return o
}

// stream runs a streaming call, passing text deltas (output_text and
// refusal) to onText, and assembles the response from the events.
func (p *Provider) stream(ctx context.Context, params responses.ResponseNewParams, onText func(string)) (result, bool, error) {
	s := p.client.NewStreaming(ctx, params)
	defer s.Close()
	var (
		emitted   bool
		id, model string
		final     *responses.Response
		items     = make(map[int64]*streamItem)
	)
	item := func(i int64) *streamItem {
		it, ok := items[i]
		if !ok {
			it = &streamItem{}
			items[i] = it
		}
		return it
	}
	text := func(ev responses.ResponseStreamEventUnion, refusal bool) {
		sp := item(ev.OutputIndex).part(ev.ContentIndex)
		sp.refusal = sp.refusal || refusal
		sp.text.WriteString(ev.Delta)
		if ev.Delta != "" {
			emitted = true
			onText(ev.Delta)
		}
	}
loop:
	for s.Next() {
		ev := s.Current()
		switch ev.Type {
		case "response.created", "response.in_progress":
			id, model = ev.Response.ID, ev.Response.Model
		case "response.output_item.added":
			it := item(ev.OutputIndex)
			it.kind, it.callID, it.name = ev.Item.Type, ev.Item.CallID, ev.Item.Name
			if ev.Item.Type == "function_call" {
				it.args.WriteString(ev.Item.Arguments.OfString)
			}
		case "response.output_text.delta":
			text(ev, false)
		case "response.refusal.delta":
			text(ev, true)
		case "response.function_call_arguments.delta":
			it := item(ev.OutputIndex)
			if it.kind == "" {
				it.kind = "function_call"
			}
			it.args.WriteString(ev.Delta)
		case "response.function_call_arguments.done":
			// The complete arguments replace the fragments.
			it := item(ev.OutputIndex)
			if it.kind == "" {
				it.kind = "function_call"
			}
			it.args.Reset()
			it.args.WriteString(ev.Arguments)
		case "response.output_item.done":
			done := itemFromAPI(ev.Item)
			item(ev.OutputIndex).done = &done
		case "response.completed", "response.incomplete":
			final = &ev.Response
			break loop
		case "response.failed":
			af := &apiFailure{code: string(ev.Response.Error.Code), message: ev.Response.Error.Message}
			if af.message == "" {
				af.message = "the response failed without a message"
			}
			return result{}, emitted, af
		case "error":
			af := &apiFailure{code: ev.Code, message: ev.Message}
			if af.message == "" {
				af = eventFailure([]byte(ev.RawJSON()))
			}
			return result{}, emitted, af
		}
	}
	if err := s.Err(); err != nil {
		return result{}, emitted, err
	}
	if final == nil {
		if err := ctx.Err(); err != nil {
			return result{}, emitted, err
		}
		return result{}, emitted, errNoEnd
	}
	if err := checkStatus(final); err != nil {
		return result{}, emitted, err
	}
	var out []outItem
	if len(items) > 0 {
		for _, i := range slices.Sorted(maps.Keys(items)) {
			out = append(out, items[i].outItem())
		}
	} else {
		for _, it := range final.Output {
			out = append(out, itemFromAPI(it))
		}
	}
	if final.ID != "" {
		id = final.ID
	}
	if final.Model != "" {
		model = final.Model
	}
	return result{
		resp: finish(final.Status, final.IncompleteDetails.Reason, model, final.Usage, out),
		id:   id,
	}, emitted, nil
}
