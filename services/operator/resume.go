package operator

import (
	"bytes"
	"compress/flate"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// A resume token carries everything a suspended invocation needs to go
// on, since the operator keeps no state between calls:
//
//	nrt1.<base64url(deflate(JSON resumeState))>.<base64url(HMAC-SHA256)>
//
// The MAC covers the version prefix and the body, under the operator's
// resume key (--resume-key, --resume-key-file, $NEURON_RESUME_KEY). With
// no key configured each process draws a random one: its tokens are then
// accepted only by the same process, so a deployment with several
// replicas (or one-shot operators, a process per invocation) must
// configure one key for all of them. The token is not encrypted: it holds
// the invocation's conversation, which its caller already sees.

// resumePrefix names the token format's version; a token of another
// version is refused.
const resumePrefix = "nrt1."

// MaxResumeToken bounds a resume token's length in bytes. An invocation
// whose state does not fit fails instead of suspending; a longer token is
// refused unread.
const MaxResumeToken = 1 << 20

// maxResumeState bounds a token's state once inflated.
const maxResumeState = 16 << 20

// MinResumeKey is the shortest resume key accepted, in bytes.
const MinResumeKey = 16

// resumeState is what a token carries: the invocation's conversation
// since its input, ending with the assistant message whose tool calls
// wait, and the counters that limits and effect keys continue from.
type resumeState struct {
	// Session is the invocation's session, nil for none: a resume must
	// name the same one.
	Session *string `json:"session,omitempty"`
	// KeyBase is the base of the invocation's effect keys (its first
	// dispatch id); NextEffect the number of effects declared so far.
	KeyBase    string `json:"key_base"`
	NextEffect int    `json:"next_effect"`
	// Turns, Usage, Cost and Failures are the loop's counters at the
	// suspension, so limits count across it.
	Turns    uint32         `json:"turns"`
	Usage    provider.Usage `json:"usage"`
	Cost     string         `json:"cost"`
	Failures int            `json:"failures"`
	// Messages are the turns since the input; the last is the assistant
	// message whose tool calls wait.
	Messages []tokenMessage `json:"messages"`
	// Pending are the calls that wait, in the model's order.
	Pending []tokenPending `json:"pending"`
	// Decided are decisions already given on calls of the same turn (a
	// turn suspended again after a resume).
	Decided []tokenDecision `json:"decided,omitempty"`
}

type tokenMessage struct {
	Role  provider.Role `json:"role"`
	Parts []tokenPart   `json:"parts"`
}

type tokenPart struct {
	Text   string               `json:"text,omitempty"`
	Use    *tokenUse            `json:"use,omitempty"`
	Result *provider.ToolResult `json:"result,omitempty"`
	Image  *provider.Image      `json:"image,omitempty"`
}

// tokenUse is a tool call; Input is kept as bytes since the model's JSON
// may be malformed.
type tokenUse struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Input []byte `json:"input"`
}

type tokenPending struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

type tokenDecision struct {
	ID        string `json:"id"`
	Approved  bool   `json:"approved"`
	Edited    []byte `json:"edited,omitempty"`
	Reason    string `json:"reason,omitempty"`
	DecidedBy string `json:"decided_by,omitempty"`
}

func toTokenMessages(msgs []provider.Message) []tokenMessage {
	out := make([]tokenMessage, len(msgs))
	for i, m := range msgs {
		parts := make([]tokenPart, len(m.Parts))
		for j, p := range m.Parts {
			tp := tokenPart{Text: p.Text, Result: p.ToolResult, Image: p.Image}
			if p.ToolUse != nil {
				tp.Use = &tokenUse{ID: p.ToolUse.ID, Name: p.ToolUse.Name, Input: p.ToolUse.Input}
			}
			parts[j] = tp
		}
		out[i] = tokenMessage{Role: m.Role, Parts: parts}
	}
	return out
}

func fromTokenMessages(msgs []tokenMessage) []provider.Message {
	out := make([]provider.Message, len(msgs))
	for i, m := range msgs {
		parts := make([]provider.Part, len(m.Parts))
		for j, p := range m.Parts {
			pp := provider.Part{Text: p.Text, ToolResult: p.Result, Image: p.Image}
			if p.Use != nil {
				pp.ToolUse = &provider.ToolUse{ID: p.Use.ID, Name: p.Use.Name, Input: json.RawMessage(p.Use.Input)}
			}
			parts[j] = pp
		}
		out[i] = provider.Message{Role: m.Role, Parts: parts}
	}
	return out
}

// resumeKey signs and checks resume tokens.
type resumeKey struct {
	key []byte
	// random is set when the key was drawn by this process, not
	// configured.
	random bool
}

// newRandomResumeKey draws a key for this process alone.
func newRandomResumeKey() resumeKey {
	k := make([]byte, 32)
	_, _ = rand.Read(k) // crypto/rand.Read never fails on Linux
	return resumeKey{key: k, random: true}
}

// ParseResumeKey decodes a resume key given in hex (--resume-key,
// $NEURON_RESUME_KEY): at least MinResumeKey bytes, 32 recommended
// (`openssl rand -hex 32`).
func ParseResumeKey(s string) ([]byte, error) {
	k, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("not hex: %v; give at least %d random bytes in hex, e.g. from `openssl rand -hex 32`", err, MinResumeKey)
	}
	if len(k) < MinResumeKey {
		return nil, fmt.Errorf("%d bytes is too short; give at least %d random bytes in hex, e.g. from `openssl rand -hex 32`", len(k), MinResumeKey)
	}
	return k, nil
}

// ReadResumeKey reads a resume key file (--resume-key-file): the key in
// hex, surrounding whitespace ignored.
func ReadResumeKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := ParseResumeKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

func (k resumeKey) mac(signed string) []byte {
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte(signed))
	return m.Sum(nil)
}

// seal encodes and signs st. A state too large for a token is
// FAILED_PRECONDITION (OPERATOR_NON_RETRYABLE): the same input would
// fail again.
func (k resumeKey) seal(st *resumeState) (string, error) {
	raw, err := json.Marshal(st)
	if err != nil {
		return "", fmt.Errorf("encoding the resume token: %v: %w", err, errs.Internal)
	}
	var buf bytes.Buffer
	zw, _ := flate.NewWriter(&buf, flate.DefaultCompression) // only a bad level fails
	if _, err := zw.Write(raw); err != nil {
		return "", fmt.Errorf("compressing the resume token: %v: %w", err, errs.Internal)
	}
	if err := zw.Close(); err != nil {
		return "", fmt.Errorf("compressing the resume token: %v: %w", err, errs.Internal)
	}
	signed := resumePrefix + base64.RawURLEncoding.EncodeToString(buf.Bytes())
	token := signed + "." + base64.RawURLEncoding.EncodeToString(k.mac(signed))
	if len(token) > MaxResumeToken {
		return "", fmt.Errorf("the invocation must wait for approval, but its conversation so far (%d bytes, %d compressed) does not fit a resume token of at most %d bytes; "+
			"lower --tool-max-output or ask for fewer or smaller tool calls per turn: %w", len(raw), buf.Len(), MaxResumeToken, errs.NonRetryable)
	}
	return token, nil
}

// errToken is the message of every token that fails its checks: which
// check failed is not said, so a forger learns nothing.
const errToken = "input.resume.resume_token is not a token this operator issued, or it was altered; pass back the resume_token of the suspended output unchanged " +
	"(operators that share work must share --resume-key)"

// open checks and decodes a token. Every failure is INVALID_ARGUMENT.
func (k resumeKey) open(token string) (*resumeState, error) {
	if len(token) > MaxResumeToken {
		return nil, fmt.Errorf("input.resume.resume_token is %d bytes; tokens are at most %d: %w", len(token), MaxResumeToken, errs.InvalidArgument)
	}
	if !strings.HasPrefix(token, resumePrefix) {
		version, _, _ := strings.Cut(token, ".")
		if len(version) > 16 {
			version = version[:16] + "..."
		}
		return nil, fmt.Errorf("input.resume.resume_token has format %q; this operator reads only %q tokens (from a suspended output of a compatible operator): %w",
			version, strings.TrimSuffix(resumePrefix, "."), errs.InvalidArgument)
	}
	signed, sig, ok := cutLast(token, ".")
	if !ok {
		return nil, fmt.Errorf("%s: %w", errToken, errs.InvalidArgument)
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, k.mac(signed)) {
		return nil, fmt.Errorf("%s: %w", errToken, errs.InvalidArgument)
	}
	body, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(signed, resumePrefix))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", errToken, errs.InvalidArgument)
	}
	raw, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(body)), maxResumeState+1))
	if err != nil || len(raw) > maxResumeState {
		return nil, fmt.Errorf("%s: %w", errToken, errs.InvalidArgument)
	}
	st := &resumeState{}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(st); err != nil {
		return nil, fmt.Errorf("%s: %w", errToken, errs.InvalidArgument)
	}
	if err := st.check(); err != nil {
		return nil, fmt.Errorf("input.resume.resume_token: %v: %w", err, errs.InvalidArgument)
	}
	return st, nil
}

// check reports a state that cannot be resumed (a signed token always
// passes; this guards against a key shared with a buggy issuer).
func (st *resumeState) check() error {
	if len(st.Messages) == 0 || st.Messages[len(st.Messages)-1].Role != provider.Assistant {
		return errors.New("the token holds no assistant turn to continue")
	}
	if len(st.Pending) == 0 {
		return errors.New("the token lists no tool call waiting for approval")
	}
	if _, err := decimal.NewFromString(st.Cost); err != nil {
		return fmt.Errorf("the token's cost %q is not a decimal", st.Cost)
	}
	return nil
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}
