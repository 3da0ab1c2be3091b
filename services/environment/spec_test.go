package environment_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

type limitCase struct {
	name string
	r    *environmentv1.ResourceLimits
	// code is the expected code; says the words the error must hold
	// (the field, the value, the bound).
	code codes.Code
	says []string
	want func(environment.Limits) bool
}

func checkLimits(t *testing.T, tests []limitCase, parse func(*environmentv1.ResourceLimits) (environment.Limits, error)) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := parse(tt.r)
			if c := errs.Code(err); c != tt.code {
				t.Fatalf("got %+v, %v; want %v", l, err, tt.code)
			}
			for _, w := range tt.says {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if err == nil && tt.want != nil && !tt.want(l) {
				t.Errorf("limits %+v", l)
			}
		})
	}
}

func cpu(v string) *environmentv1.ResourceLimits { return &environmentv1.ResourceLimits{Cpu: &v} }
func mem(v string) *environmentv1.ResourceLimits { return &environmentv1.ResourceLimits{Memory: &v} }
func disk(v string) *environmentv1.ResourceLimits {
	return &environmentv1.ResourceLimits{Disk: &v}
}
func gpu(v string) *environmentv1.ResourceLimits { return &environmentv1.ResourceLimits{Gpu: &v} }
func procs(n uint32) *environmentv1.ResourceLimits {
	return &environmentv1.ResourceLimits{MaxProcesses: &n}
}
func output(n uint64) *environmentv1.ResourceLimits {
	return &environmentv1.ResourceLimits{MaxOutputBytes: &n}
}
func cpuTime(d *durationpb.Duration) *environmentv1.ResourceLimits {
	return &environmentv1.ResourceLimits{CpuTime: d}
}

// ParseLimits refuses, with INVALID_ARGUMENT naming the field, the value
// and the range, every quantity no backend can enforce as asked, so a
// client never sees it fail later as UNAVAILABLE (and retry forever) or
// run with no limit at all.
func TestParseLimits(t *testing.T) {
	ia := codes.InvalidArgument
	checkLimits(t, []limitCase{
		{"nothing set", nil, codes.OK, nil, func(l environment.Limits) bool { return l.MemoryBytes == 1<<30 }},
		// cpu
		{"cpu below the CFS minimum", cpu("1m"), ia, []string{"resources.cpu", `"1m"`, "10m"}, nil},
		{"cpu just below the CFS minimum", cpu("9m"), ia, []string{"resources.cpu", "10m"}, nil},
		{"cpu at the CFS minimum", cpu("10m"), codes.OK, nil, func(l environment.Limits) bool { return l.CPUMillis == 10 }},
		{"cpu in cores", cpu("1.5"), codes.OK, nil, func(l environment.Limits) bool { return l.CPUMillis == 1500 }},
		{"cpu in fractions of a millicore", cpu("10.5m"), ia, []string{"resources.cpu", `"10.5m"`, "whole number of millicores"}, nil},
		{"cpu that overflows", cpu("1e30"), ia, []string{"resources.cpu", "too large"}, nil},
		{"cpu that wraps negative", cpu("9Ei"), ia, []string{"resources.cpu", "too large"}, nil},
		{"negative cpu", cpu("-1"), ia, []string{"resources.cpu", "positive"}, nil},
		{"malformed cpu", cpu("lots"), ia, []string{"resources.cpu", `"lots"`}, nil},
		// memory and disk
		{"memory that overflows to no limit", mem("1e400"), ia, []string{"resources.memory", `"1e400"`, "too large"}, nil},
		{"memory that saturates", mem("9Ei"), ia, []string{"resources.memory", "too large"}, nil},
		{"memory of half a byte", mem("0.5"), ia, []string{"resources.memory", `"0.5"`, "whole number of bytes"}, nil},
		{"memory in millibytes", mem("100m"), ia, []string{"resources.memory", "whole number of bytes"}, nil},
		{"memory in fractional gibibytes", mem("1.5Gi"), codes.OK, nil, func(l environment.Limits) bool { return l.MemoryBytes == 3<<29 }},
		{"largest memory", mem("9223372036854775806"), codes.OK, nil, func(l environment.Limits) bool { return l.MemoryBytes == math.MaxInt64-1 }},
		{"memory at int64's maximum", mem("9223372036854775807"), ia, []string{"resources.memory", "too large"}, nil},
		{"disk that overflows", disk("1e30"), ia, []string{"resources.disk", "too large"}, nil},
		{"disk of a fraction of a byte", disk("1.5"), ia, []string{"resources.disk", "whole number of bytes"}, nil},
		// gpu
		{"half a gpu", gpu("0.5"), ia, []string{"resources.gpu", "whole number"}, nil},
		{"gpus", gpu("2"), codes.OK, nil, func(l environment.Limits) bool { return l.GPUs == 2 }},
		// max_processes
		{"processes above the kernel's limit", procs(math.MaxUint32), ia, []string{"resources.max_processes", "4294967295", "kernel", "4194304"}, nil},
		{"processes at the kernel's limit", procs(environment.MaxPIDs), codes.OK, nil, nil},
		{"no processes", procs(0), ia, []string{"resources.max_processes"}, nil},
		// max_output_bytes
		{"no output", output(0), ia, []string{"resources.max_output_bytes"}, nil},
		// cpu_time
		{"cpu_time with nanos of a second", cpuTime(&durationpb.Duration{Seconds: 2, Nanos: 1_000_000_000}), ia, []string{"resources.cpu_time", "not a valid duration"}, nil},
		{"cpu_time with signs that differ", cpuTime(&durationpb.Duration{Seconds: 5, Nanos: -1}), ia, []string{"resources.cpu_time", "not a valid duration"}, nil},
		{"cpu_time beyond a time.Duration", cpuTime(&durationpb.Duration{Seconds: 1 << 40}), ia, []string{"resources.cpu_time"}, nil},
		{"cpu_time under a second", cpuTime(durationpb.New(500 * time.Millisecond)), ia, []string{"resources.cpu_time", "1s"}, nil},
		{"cpu_time", cpuTime(durationpb.New(90 * time.Second)), codes.OK, nil, func(l environment.Limits) bool { return l.CPUTime == 90*time.Second }},
	}, func(r *environmentv1.ResourceLimits) (environment.Limits, error) {
		return environment.ParseLimits(r, environment.Limits{MemoryBytes: 1 << 30})
	})
}

// testDefaults are the service's limits of the ceiling tests, fixed
// rather than taken from the host.
func testDefaults() environment.Defaults {
	d := environment.DefaultDefaults()
	d.Max.CPUMillis = 4000
	return d
}

// Defaults.ParseLimits also holds a spec to the service's floor and
// ceilings, naming the field, the value and the bound.
func TestDefaultsParseLimits(t *testing.T) {
	ia := codes.InvalidArgument
	d := testDefaults()
	checkLimits(t, []limitCase{
		{"unset fields take the defaults", &environmentv1.ResourceLimits{}, codes.OK, nil, func(l environment.Limits) bool {
			return l.MemoryBytes == 2<<30 && l.MaxProcesses == 256 && l.MaxOutputBytes == 16<<20
		}},
		{"cpu above the ceiling", cpu("5"), ia, []string{"resources.cpu", `"5"`, "ceiling", "4000m"}, nil},
		{"cpu at the ceiling", cpu("4"), codes.OK, nil, nil},
		{"memory below the floor", mem("8Mi"), ia, []string{"resources.memory", `"8Mi"`, "floor", "16Mi"}, nil},
		{"memory at the floor", mem("16Mi"), codes.OK, nil, nil},
		{"memory above the ceiling", mem("65Gi"), ia, []string{"resources.memory", `"65Gi"`, "ceiling", "64Gi"}, nil},
		{"memory the kernel takes but the service does not", mem("7Ei"), ia, []string{"resources.memory", "ceiling"}, nil},
		{"disk above the ceiling", disk("101Gi"), ia, []string{"resources.disk", "100Gi"}, nil},
		{"gpus above the ceiling", gpu("9"), ia, []string{"resources.gpu", "8"}, nil},
		{"processes above the ceiling", procs(1<<16 + 1), ia, []string{"resources.max_processes", "65537", "65536"}, nil},
		{"processes at the ceiling", procs(1 << 16), codes.OK, nil, nil},
		{"output larger than a message", output(16<<20 + 1), ia, []string{"resources.max_output_bytes", "16777217", "16Mi"}, nil},
		{"output of a message", output(16 << 20), codes.OK, nil, nil},
		{"cpu_time above the ceiling", cpuTime(durationpb.New(25 * time.Hour)), ia, []string{"resources.cpu_time", "25h", "24h"}, nil},
		{"kernel ranges still apply", cpu("1m"), ia, []string{"resources.cpu", "10m"}, nil},
	}, d.ParseLimits)

	// A zero ceiling is none; a zero floor too.
	var open environment.Defaults
	if _, err := open.ParseLimits(&environmentv1.ResourceLimits{Cpu: proto.String("1000"), Memory: proto.String("1Ki")}); err != nil {
		t.Errorf("no ceilings: %v", err)
	}
}

func TestParseTimeout(t *testing.T) {
	d := testDefaults()
	ia := codes.InvalidArgument
	for _, tt := range []struct {
		name    string
		timeout *durationpb.Duration
		want    time.Duration
		code    codes.Code
		says    []string
	}{
		{"unset", nil, 10 * time.Minute, codes.OK, nil},
		{"set", durationpb.New(30 * time.Second), 30 * time.Second, codes.OK, nil},
		{"nanos of a second", &durationpb.Duration{Seconds: 1, Nanos: 1_000_000_000}, 0, ia, []string{"spec.timeout", "not a valid duration"}},
		{"signs that differ", &durationpb.Duration{Seconds: 1, Nanos: -5}, 0, ia, []string{"spec.timeout", "not a valid duration"}},
		{"beyond 10000 years", &durationpb.Duration{Seconds: 1 << 62}, 0, ia, []string{"spec.timeout"}},
		{"zero", &durationpb.Duration{}, 0, ia, []string{"spec.timeout", "positive"}},
		{"above the maximum", durationpb.New(2 * time.Hour), 0, ia, []string{"spec.timeout", "2h0m0s", "1h0m0s"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := d.ParseTimeout(&environmentv1.EnvironmentSpec{Timeout: tt.timeout})
			if c := errs.Code(err); c != tt.code {
				t.Fatalf("got %v, %v; want %v", got, err, tt.code)
			}
			for _, w := range tt.says {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if err == nil && got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// Through a real environment server: quantities no backend can enforce
// are INVALID_ARGUMENT before anything runs.
func TestRunRefusesQuantitiesOutOfRange(t *testing.T) {
	e := startEnv(t, envOptions{})
	for _, tt := range []struct {
		name string
		r    *environmentv1.ResourceLimits
		says string
	}{
		{"memory that overflows", mem("1e400"), "resources.memory"},
		{"cpu below the CFS minimum", cpu("1m"), "resources.cpu"},
		{"processes above the kernel's limit", procs(math.MaxUint32), "resources.max_processes"},
		{"invalid cpu_time", cpuTime(&durationpb.Duration{Seconds: 1, Nanos: -5}), "resources.cpu_time"},
		{"memory above the service's ceiling", mem("65Gi"), "resources.memory"},
		{"memory below the floor", mem("1Mi"), "resources.memory"},
		{"invalid timeout", nil, "spec.timeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec := &environmentv1.EnvironmentSpec{Resources: tt.r}
			if tt.r == nil {
				spec.Timeout = &durationpb.Duration{Seconds: 5, Nanos: 2_000_000_000}
			}
			_, err := e.run(t, "hello", spec)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.says) {
				t.Errorf("got %v, want INVALID_ARGUMENT naming %s", err, tt.says)
			}
		})
	}
}
