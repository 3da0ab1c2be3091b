package state

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

// jsonSizeOracle is what jsonSize must equal: the length of what
// encoding/json writes for v.AsInterface() without HTML escaping.
func jsonSizeOracle(t testing.TB, v *structpb.Value) int {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v.AsInterface()); err != nil {
		t.Fatal(err)
	}
	return buf.Len() - 1 // Encode appends a newline
}

// jsonSizeStrings are strings whose JSON length depends on escaping.
var jsonSizeStrings = []string{
	"", "plain", `quote " and backslash \`, "<html> & 'amp'", "tab\tnew\nline\rcr\bbs\fff",
	"\x00\x01\x1f\x7f", "é ü 日本語 🎉", "line\u2028para\u2029sep", "\ufffd replacement",
	strings.Repeat("long text ", 100),
}

// jsonSizeNumbers cover both notations and the exponent clean-up.
var jsonSizeNumbers = []float64{
	0, math.Copysign(0, -1), 1, -1, 0.5, 1e-6, 9.99e-7, 1e-7, 1.5e-10, 1e20, 1e21, 1.25e21, -3e300,
	123456789012345678, 0.1 + 0.2, math.MaxFloat64, math.SmallestNonzeroFloat64, -42.125,
}

func TestJSONSize(t *testing.T) {
	var vals []*structpb.Value
	for _, s := range jsonSizeStrings {
		vals = append(vals, structpb.NewStringValue(s))
	}
	for _, f := range jsonSizeNumbers {
		vals = append(vals, structpb.NewNumberValue(f))
	}
	vals = append(vals,
		structpb.NewNullValue(), structpb.NewBoolValue(true), structpb.NewBoolValue(false),
		structpb.NewListValue(&structpb.ListValue{}), structpb.NewStructValue(&structpb.Struct{}),
		&structpb.Value{Kind: &structpb.Value_ListValue{}}, &structpb.Value{Kind: &structpb.Value_StructValue{}},
		mustValue(t, map[string]any{
			"title": "note", "tab\tkey": []any{1.5, "x", nil, true, map[string]any{}}, "é\u2028": map[string]any{"n": 1e-9},
			"empty": []any{}, "": "", "list": []any{[]any{[]any{"deep"}}},
		}),
	)
	for _, v := range vals {
		got, err := jsonSize(v)
		if want := jsonSizeOracle(t, v); err != nil || got != want {
			t.Errorf("jsonSize(%v) = %d, %v; encoding/json writes %d bytes", v, got, err, want)
		}
	}
	if _, err := jsonSize(&structpb.Value{}); err == nil {
		t.Error("a value without kind has a size")
	}
}

func FuzzJSONSize(f *testing.F) {
	for i, s := range jsonSizeStrings {
		f.Add(s, jsonSizeNumbers[i%len(jsonSizeNumbers)])
	}
	f.Fuzz(func(t *testing.T, s string, n float64) {
		if math.IsNaN(n) || math.IsInf(n, 0) {
			return
		}
		v := structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{
			structpb.NewStringValue(s), structpb.NewNumberValue(n),
			structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{s: structpb.NewNumberValue(n)}}),
		}})
		got, err := jsonSize(v)
		if want := jsonSizeOracle(t, v); err != nil || got != want {
			t.Fatalf("jsonSize(%q, %v) = %d, %v; encoding/json writes %d bytes", s, n, got, err, want)
		}
	})
}
