package state

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/secbear/neuron/pkg/errs"
)

// Default limits.
const (
	DefaultMaxKeyBytes   = 4096
	DefaultMaxValueBytes = 1 << 20
	// MaxKeyBytesCeiling is the largest MaxKeyBytes OpenBolt accepts: a
	// bbolt key holds the encoded scope (at most about 2 KiB) and the key
	// in at most 32 KiB.
	MaxKeyBytesCeiling = 30000

	// MaxIdempotencyKeyBytes is the longest idempotency key (the proto's
	// max_len, counted in bytes here).
	MaxIdempotencyKeyBytes = 512 * 4
	// MaxPageSize is the largest List page.
	MaxPageSize = 1000
	// MaxSearchLimit is the largest Search limit.
	MaxSearchLimit = 1000
	// MaxQueryChars is the longest Search query, in characters.
	MaxQueryChars = 4096
)

// Limits bounds what a store accepts. Both backends enforce the same
// limits with the same messages.
type Limits struct {
	// MaxKeyBytes is the longest key in bytes (flag --max-key-bytes).
	MaxKeyBytes int
	// MaxValueBytes is the largest value, measured as its compact JSON
	// encoding, in bytes (flag --max-value-bytes).
	MaxValueBytes int
}

// DefaultLimits returns the default limits: 4 KiB keys, 1 MiB values.
func DefaultLimits() Limits {
	return Limits{MaxKeyBytes: DefaultMaxKeyBytes, MaxValueBytes: DefaultMaxValueBytes}
}

func (l Limits) checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("key is empty: %w", errs.InvalidArgument)
	case len(key) > l.MaxKeyBytes:
		return fmt.Errorf("key is %d bytes; the limit is %d (--max-key-bytes): %w", len(key), l.MaxKeyBytes, errs.InvalidArgument)
	case !utf8.ValidString(key):
		return fmt.Errorf("key is not valid UTF-8: %w", errs.InvalidArgument)
	}
	return nil
}

// checkValue validates v (set, every nested kind set, finite numbers,
// UTF-8 strings) and its JSON size against MaxValueBytes.
func (l Limits) checkValue(v *structpb.Value) error {
	if v == nil {
		return fmt.Errorf("value is required: %w", errs.InvalidArgument)
	}
	if err := checkValueShape(v, 0); err != nil {
		return err
	}
	n, err := jsonSize(v)
	if err != nil {
		return fmt.Errorf("value cannot be encoded as JSON: %w", errs.InvalidArgument)
	}
	if n > l.MaxValueBytes {
		return fmt.Errorf("value is %d bytes as JSON; the limit is %d (--max-value-bytes): %w", n, l.MaxValueBytes, errs.LimitExceeded)
	}
	return nil
}

// maxValueDepth bounds nesting; protobuf's own decoder stops at 10000.
const maxValueDepth = 1000

func checkValueShape(v *structpb.Value, depth int) error {
	if depth > maxValueDepth {
		return fmt.Errorf("value is nested more than %d levels: %w", maxValueDepth, errs.InvalidArgument)
	}
	switch k := v.GetKind().(type) {
	case nil:
		return fmt.Errorf("value (or a value nested in it) has no kind set: %w", errs.InvalidArgument)
	case *structpb.Value_NumberValue:
		if math.IsNaN(k.NumberValue) || math.IsInf(k.NumberValue, 0) {
			return fmt.Errorf("value holds %v, which JSON cannot represent: %w", k.NumberValue, errs.InvalidArgument)
		}
	case *structpb.Value_StringValue:
		if !utf8.ValidString(k.StringValue) {
			return fmt.Errorf("value holds a string that is not valid UTF-8: %w", errs.InvalidArgument)
		}
	case *structpb.Value_StructValue:
		for name, f := range k.StructValue.GetFields() {
			if !utf8.ValidString(name) {
				return fmt.Errorf("value holds a field name that is not valid UTF-8: %w", errs.InvalidArgument)
			}
			if f == nil {
				return fmt.Errorf("value field %q is nil: %w", truncate(name), errs.InvalidArgument)
			}
			if err := checkValueShape(f, depth+1); err != nil {
				return err
			}
		}
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if e == nil {
				return fmt.Errorf("value holds a nil list element: %w", errs.InvalidArgument)
			}
			if err := checkValueShape(e, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonSize is the length of the compact JSON encoding of v that
// encoding/json writes for v.AsInterface() (without HTML escaping), the
// measure MaxValueBytes applies to. It counts instead of encoding, so
// that a write allocates nothing for it; TestJSONSize checks it against
// encoding/json. v must have passed checkValueShape (every kind set,
// finite numbers, UTF-8 strings); a value that did not is an error.
func jsonSize(v *structpb.Value) (int, error) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		return len("null"), nil
	case *structpb.Value_BoolValue:
		if k.BoolValue {
			return len("true"), nil
		}
		return len("false"), nil
	case *structpb.Value_NumberValue:
		return jsonNumberSize(k.NumberValue)
	case *structpb.Value_StringValue:
		return jsonStringSize(k.StringValue), nil
	case *structpb.Value_ListValue:
		vals := k.ListValue.GetValues()
		n := 2 + max(len(vals)-1, 0) // [ ] and commas
		for _, e := range vals {
			m, err := jsonSize(e)
			if err != nil {
				return 0, err
			}
			n += m
		}
		return n, nil
	case *structpb.Value_StructValue:
		fields := k.StructValue.GetFields()
		n := 2 + max(len(fields)-1, 0) // { } and commas
		for name, f := range fields {
			m, err := jsonSize(f)
			if err != nil {
				return 0, err
			}
			n += jsonStringSize(name) + 1 + m // "name":value
		}
		return n, nil
	}
	return 0, errors.New("value has no kind set")
}

// jsonNumberSize is the length of f as encoding/json writes a float64:
// strconv's shortest form, 'e' notation outside [1e-6, 1e21), with a
// one-digit negative exponent not padded.
func jsonNumberSize(f float64) (int, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, errors.New("value holds a number JSON cannot represent")
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	var buf [32]byte
	b := strconv.AppendFloat(buf[:0], f, format, -1, 64)
	n := len(b)
	if format == 'e' && n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
		n-- // e-09 is written e-9
	}
	return n, nil
}

// jsonStringSize is the length of s as encoding/json writes it without
// HTML escaping: quoted, with \\, \" and \b \f \n \r \t as two bytes,
// other control characters, U+2028, U+2029 and invalid bytes as six.
func jsonStringSize(s string) int {
	n := 2
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			switch {
			case b == '\\' || b == '"' || b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t':
				n += 2
			case b < 0x20:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1, c == '\u2028', c == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}

func checkIdempotencyKey(k string) error {
	if len(k) > MaxIdempotencyKeyBytes || utf8.RuneCountInString(k) > 512 {
		return fmt.Errorf("idempotency_key is %d characters; the limit is 512: %w", utf8.RuneCountInString(k), errs.InvalidArgument)
	}
	if !utf8.ValidString(k) {
		return fmt.Errorf("idempotency_key is not valid UTF-8: %w", errs.InvalidArgument)
	}
	return nil
}

func checkPageSize(n int) error {
	if n < 1 || n > MaxPageSize {
		return fmt.Errorf("page_size is %d; it must be between 1 and %d: %w", n, MaxPageSize, errs.InvalidArgument)
	}
	return nil
}

func checkSearch(query string, limit int) error {
	if query == "" {
		return fmt.Errorf("query is empty: %w", errs.InvalidArgument)
	}
	if n := utf8.RuneCountInString(query); n > MaxQueryChars {
		return fmt.Errorf("query is %d characters; the limit is %d: %w", n, MaxQueryChars, errs.InvalidArgument)
	}
	if !utf8.ValidString(query) {
		return fmt.Errorf("query is not valid UTF-8: %w", errs.InvalidArgument)
	}
	if limit < 1 || limit > MaxSearchLimit {
		return fmt.Errorf("limit is %d; it must be between 1 and %d: %w", limit, MaxSearchLimit, errs.InvalidArgument)
	}
	return nil
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
