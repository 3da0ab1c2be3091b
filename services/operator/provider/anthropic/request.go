package anthropic

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	sdk "github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/packages/param"

	"github.com/secbear/neuron/services/operator/provider"
)

// MetadataUserID is the Request.Metadata key forwarded as the API's
// metadata.user_id (an opaque end-user id) when its value is a non-empty
// string. Other metadata is not sent.
const MetadataUserID = "user_id"

// emptyToolInput replaces a tool_use input in the history that is not a
// JSON object (the API accepts nothing else there).
var emptyToolInput = json.RawMessage("{}")

// params maps a request to the Messages API.
func (p *Provider) params(model string, req *provider.Request) (sdk.MessageNewParams, error) {
	if req.MaxTokens < 0 {
		return sdk.MessageNewParams{}, p.invalid(model, "max tokens %d is negative", req.MaxTokens)
	}
	maxTokens := req.MaxTokens
	if maxTokens == 0 {
		maxTokens = p.maxTokens
	}
	params := sdk.MessageNewParams{
		Model:     sdk.Model(model),
		MaxTokens: int64(maxTokens),
	}
	if req.System != "" {
		params.System = []sdk.TextBlockParam{{Text: req.System}}
	}
	msgs, err := p.messages(model, req.Messages)
	if err != nil {
		return sdk.MessageNewParams{}, err
	}
	params.Messages = msgs
	for i, t := range req.Tools {
		tool, err := p.tool(model, i, t)
		if err != nil {
			return sdk.MessageNewParams{}, err
		}
		params.Tools = append(params.Tools, tool)
	}
	if id, ok := req.Metadata[MetadataUserID].(string); ok && id != "" {
		params.Metadata = sdk.MetadataParam{UserID: param.NewOpt(id)}
	}
	if err := p.modelParams(model, req, &params); err != nil {
		return sdk.MessageNewParams{}, err
	}
	return params, nil
}

// modelParams maps the model parameters: temperature (the Messages API
// accepts 0 to 1), reasoning effort (output_config.effort: low, medium,
// high; there is no minimal level) and the output schema
// (output_config.format). What the API cannot take is refused with an
// error naming the parameter, never dropped.
func (p *Provider) modelParams(model string, req *provider.Request, params *sdk.MessageNewParams) error {
	if t := req.Temperature; t != nil {
		if *t < 0 || *t > 1 {
			return provider.ParamError(Name, model, "temperature", fmt.Sprintf("%g is outside the range this provider accepts, 0 to 1", *t))
		}
		params.Temperature = param.NewOpt(*t)
	}
	switch req.ReasoningEffort {
	case "":
	case provider.EffortLow, provider.EffortMedium, provider.EffortHigh:
		params.OutputConfig.Effort = sdk.OutputConfigEffort(req.ReasoningEffort)
	default:
		return provider.ParamError(Name, model, "reasoning_effort", fmt.Sprintf("%q is not supported; this provider accepts low, medium or high", req.ReasoningEffort))
	}
	if req.OutputSchema != nil {
		params.OutputConfig.Format = sdk.JSONOutputFormatParam{Schema: req.OutputSchema}
	}
	return nil
}

// messages maps the conversation. Empty text parts and messages left with
// no content are dropped (the API rejects both), and consecutive messages
// of one role are merged (the API wants user and assistant to alternate).
func (p *Provider) messages(model string, in []provider.Message) ([]sdk.MessageParam, error) {
	var out []sdk.MessageParam
	for i, m := range in {
		var role sdk.MessageParamRole
		switch m.Role {
		case provider.User:
			role = sdk.MessageParamRoleUser
		case provider.Assistant:
			role = sdk.MessageParamRoleAssistant
		default:
			return nil, p.invalid(model, "messages[%d]: unknown role %d", i, int(m.Role))
		}
		var blocks []sdk.ContentBlockParamUnion
		for j, part := range m.Parts {
			b, ok, err := block(part)
			if err != nil {
				return nil, p.invalid(model, "messages[%d].parts[%d]: %v", i, j, err)
			}
			if ok {
				blocks = append(blocks, b)
			}
		}
		if len(blocks) == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Role == role {
			out[n-1].Content = append(out[n-1].Content, blocks...)
			continue
		}
		out = append(out, sdk.MessageParam{Role: role, Content: blocks})
	}
	return out, nil
}

// block maps one part; ok is false for a part that sends nothing (empty
// text).
func block(part provider.Part) (b sdk.ContentBlockParamUnion, ok bool, err error) {
	switch {
	case part.ToolUse != nil:
		tu := part.ToolUse
		if tu.ID == "" || tu.Name == "" {
			return b, false, errors.New("tool use needs an id and a name")
		}
		return sdk.ContentBlockParamUnion{OfToolUse: &sdk.ToolUseBlockParam{
			ID: tu.ID, Name: tu.Name, Input: historyToolInput(tu.Input),
		}}, true, nil
	case part.ToolResult != nil:
		tr := part.ToolResult
		if tr.ToolUseID == "" {
			return b, false, errors.New("tool result needs the tool use id")
		}
		res := &sdk.ToolResultBlockParam{ToolUseID: tr.ToolUseID}
		if tr.Content != "" {
			res.Content = []sdk.ToolResultBlockParamContentUnion{{OfText: &sdk.TextBlockParam{Text: tr.Content}}}
		}
		if tr.IsError {
			res.IsError = param.NewOpt(true)
		}
		return sdk.ContentBlockParamUnion{OfToolResult: res}, true, nil
	case part.Image != nil:
		img, err := image(part.Image)
		if err != nil {
			return b, false, err
		}
		return sdk.ContentBlockParamUnion{OfImage: img}, true, nil
	case part.Text != "":
		return sdk.ContentBlockParamUnion{OfText: &sdk.TextBlockParam{Text: part.Text}}, true, nil
	}
	return b, false, nil
}

// historyToolInput is a tool call's input as sent back in the history: the
// model's JSON when it is an object, else {}. A call whose input was not a
// JSON object never ran; its tool result says so.
func historyToolInput(in json.RawMessage) json.RawMessage {
	trimmed := bytes.TrimSpace(in)
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		return emptyToolInput
	}
	return json.RawMessage(trimmed)
}

// imageTypes are the media types the API accepts inline.
var imageTypes = map[string]sdk.Base64ImageSourceMediaType{
	"image/jpeg": sdk.Base64ImageSourceMediaTypeImageJPEG,
	"image/jpg":  sdk.Base64ImageSourceMediaTypeImageJPEG,
	"image/png":  sdk.Base64ImageSourceMediaTypeImagePNG,
	"image/gif":  sdk.Base64ImageSourceMediaTypeImageGIF,
	"image/webp": sdk.Base64ImageSourceMediaTypeImageWebP,
}

// image maps an image: inline data as a base64 source (media type sniffed
// when not given), else a URL source.
func image(img *provider.Image) (*sdk.ImageBlockParam, error) {
	switch {
	case len(img.Data) > 0:
		mt := strings.ToLower(strings.TrimSpace(img.MediaType))
		if mt == "" {
			mt, _, _ = strings.Cut(http.DetectContentType(img.Data), ";")
		}
		wire, ok := imageTypes[mt]
		if !ok {
			return nil, fmt.Errorf("image media type %q is not one of image/jpeg, image/png, image/gif, image/webp", mt)
		}
		return &sdk.ImageBlockParam{Source: sdk.ImageBlockParamSourceUnion{OfBase64: &sdk.Base64ImageSourceParam{
			Data: base64.StdEncoding.EncodeToString(img.Data), MediaType: wire,
		}}}, nil
	case img.URL != "":
		return &sdk.ImageBlockParam{Source: sdk.ImageBlockParamSourceUnion{OfURL: &sdk.URLImageSourceParam{
			URL: img.URL,
		}}}, nil
	}
	return nil, errors.New("image has neither data nor a URL")
}

// tool maps a tool spec; its input schema is sent verbatim ({"type":"object"}
// when empty) and must be a JSON object.
func (p *Provider) tool(model string, i int, t provider.ToolSpec) (sdk.ToolUnionParam, error) {
	if t.Name == "" {
		return sdk.ToolUnionParam{}, p.invalid(model, "tools[%d]: name is required", i)
	}
	schema := bytes.TrimSpace(t.InputSchema)
	if len(schema) == 0 {
		schema = []byte(`{"type":"object"}`)
	}
	if schema[0] != '{' || !json.Valid(schema) {
		return sdk.ToolUnionParam{}, p.invalid(model, "tools[%d] (%s): input schema is not a JSON object", i, t.Name)
	}
	tp := &sdk.ToolParam{
		Name:        t.Name,
		InputSchema: param.Override[sdk.ToolInputSchemaParam](json.RawMessage(schema)),
	}
	if t.Description != "" {
		tp.Description = param.NewOpt(t.Description)
	}
	return sdk.ToolUnionParam{OfTool: tp}, nil
}
