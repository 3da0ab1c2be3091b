package money_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc/codes"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
)

func TestFromDecimal(t *testing.T) {
	tests := []struct {
		name string
		in   decimal.Decimal
		want string
	}{
		{"zero", decimal.Zero, "0"},
		{"zero with exponent", decimal.New(0, -3), "0"},
		{"whole", decimal.NewFromInt(12), "12"},
		{"positive exponent has no E", decimal.New(15, 2), "1500"},
		{"trailing zeros trimmed", decimal.RequireFromString("1.2300"), "1.23"},
		{"whole with fraction zeros", decimal.RequireFromString("2.000"), "2"},
		{"small", decimal.RequireFromString("0.0125"), "0.0125"},
		{"tiny", decimal.New(1, -20), "0.00000000000000000001"},
		{"large", decimal.New(5, 20), "500000000000000000000"},
		{"from exponent input", decimal.RequireFromString("1.5e-3"), "0.0015"},
		{"negative zero", decimal.RequireFromString("-0"), "0"},
		{"exactly MaxLen", decimal.RequireFromString("0." + strings.Repeat("1", money.MaxLen-2)), "0." + strings.Repeat("1", money.MaxLen-2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := money.FromDecimal(tt.in)
			if got.GetAmount() != tt.want {
				t.Fatalf("FromDecimal(%s) = %q, want %q", tt.in, got.GetAmount(), tt.want)
			}
			back, err := money.Parse(got)
			if err != nil {
				t.Fatalf("Parse(FromDecimal(%s)): %v", tt.in, err)
			}
			if !back.Equal(tt.in) {
				t.Errorf("Parse(FromDecimal(%s)) = %s", tt.in, back)
			}
		})
	}
}

func TestFromDecimalPanics(t *testing.T) {
	tests := []struct {
		name string
		in   decimal.Decimal
	}{
		{"negative", decimal.RequireFromString("-0.01")},
		{"longer than MaxLen", decimal.New(1, -money.MaxLen)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("FromDecimal(%s) did not panic", tt.in)
				}
			}()
			money.FromDecimal(tt.in)
		})
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      *typesv1.Money
		want    string // decimal form; ignored when wantErr
		wantErr bool
	}{
		{name: "nil is zero", in: nil, want: "0"},
		{name: "empty is zero", in: &typesv1.Money{}, want: "0"},
		{name: "zero", in: amount("0"), want: "0"},
		{name: "whole", in: amount("12"), want: "12"},
		{name: "fraction", in: amount("0.0125"), want: "0.0125"},
		{name: "leading and trailing zeros", in: amount("007.50"), want: "7.5"},
		{name: "MaxLen digits", in: amount(strings.Repeat("9", money.MaxLen)), want: strings.Repeat("9", money.MaxLen)},

		{name: "exponent", in: amount("1e5"), wantErr: true},
		{name: "upper exponent", in: amount("1E5"), wantErr: true},
		{name: "negative", in: amount("-1"), wantErr: true},
		{name: "plus sign", in: amount("+1"), wantErr: true},
		{name: "unicode minus", in: amount("\u22121"), wantErr: true},
		{name: "letters", in: amount("abc"), wantErr: true},
		{name: "trailing point", in: amount("1."), wantErr: true},
		{name: "leading point", in: amount(".5"), wantErr: true},
		{name: "point only", in: amount("."), wantErr: true},
		{name: "two points", in: amount("1.2.3"), wantErr: true},
		{name: "comma", in: amount("1,5"), wantErr: true},
		{name: "space", in: amount(" 1"), wantErr: true},
		{name: "hex", in: amount("0x10"), wantErr: true},
		{name: "NaN", in: amount("NaN"), wantErr: true},
		{name: "non-ASCII digit", in: amount("\u0661"), wantErr: true},
		{name: "longer than MaxLen", in: amount(strings.Repeat("1", money.MaxLen+1)), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := money.Parse(tt.in)
			if tt.wantErr {
				if !errors.Is(err, errs.InvalidArgument) || errs.Code(err) != codes.InvalidArgument {
					t.Fatalf("Parse(%q) error = %v, want one wrapping errs.InvalidArgument", tt.in.GetAmount(), err)
				}
				// The message names the value (its start, when long).
				shown := tt.in.GetAmount()
				if len(shown) > 16 {
					shown = shown[:16]
				}
				if !strings.Contains(err.Error(), strconv.Quote(shown)) {
					t.Errorf("error %q does not name the value %q", err, shown)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in.GetAmount(), err)
			}
			if !got.Equal(decimal.RequireFromString(tt.want)) {
				t.Errorf("Parse(%q) = %s, want %s", tt.in.GetAmount(), got, tt.want)
			}
		})
	}
}

// TestSumIsExact is why Money is a string: 0.1 has no exact float, and
// summing it 10,000 times in float64 gives 1000.0000000001588.
func TestSumIsExact(t *testing.T) {
	const n = 10000
	tenth := amount("0.1")

	ms := make([]*typesv1.Money, n)
	for i := range ms {
		ms[i] = tenth
	}
	sum, err := money.Sum(ms...)
	if err != nil {
		t.Fatal(err)
	}
	if got := money.FromDecimal(sum).GetAmount(); got != "1000" {
		t.Errorf("Sum of %d x 0.1 = %s, want exactly 1000", n, got)
	}

	acc := &typesv1.Money{}
	for range n {
		if acc, err = money.Add(acc, tenth); err != nil {
			t.Fatal(err)
		}
	}
	if acc.GetAmount() != "1000" {
		t.Errorf("Add of %d x 0.1 = %s, want exactly 1000", n, acc.GetAmount())
	}
}

func TestSumAndAdd(t *testing.T) {
	tests := []struct {
		name    string
		a, b    *typesv1.Money
		want    string
		wantErr bool
	}{
		{name: "nil plus nil", want: "0"},
		{name: "empty plus value", a: &typesv1.Money{}, b: amount("0.0125"), want: "0.0125"},
		{name: "carries", a: amount("0.0075"), b: amount("0.0025"), want: "0.01"},
		{name: "whole", a: amount("1.5"), b: amount("2.5"), want: "4"},
		{name: "malformed first", a: amount("1e5"), b: amount("1"), wantErr: true},
		{name: "malformed second", a: amount("1"), b: amount("-1"), wantErr: true},
		{name: "sum longer than MaxLen", a: amount(strings.Repeat("9", money.MaxLen)), b: amount("1"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := money.Add(tt.a, tt.b)
			if tt.wantErr {
				if !errors.Is(err, errs.InvalidArgument) {
					t.Fatalf("Add error = %v, want one wrapping errs.InvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.GetAmount() != tt.want {
				t.Errorf("Add(%q, %q) = %q, want %q", tt.a.GetAmount(), tt.b.GetAmount(), got.GetAmount(), tt.want)
			}
			sum, err := money.Sum(tt.a, tt.b)
			if err != nil {
				t.Fatal(err)
			}
			if !sum.Equal(decimal.RequireFromString(tt.want)) {
				t.Errorf("Sum = %s, want %s", sum, tt.want)
			}
		})
	}
}

func TestSumNamesIndex(t *testing.T) {
	_, err := money.Sum(amount("1"), amount("2"), amount("x"))
	if err == nil || !strings.Contains(err.Error(), "amount 2") || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("Sum error = %v, want it to name index 2 and the value", err)
	}
}

func amount(s string) *typesv1.Money { return &typesv1.Money{Amount: s} }
