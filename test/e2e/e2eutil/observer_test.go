package e2eutil

import (
	"strings"
	"testing"
	"time"
)

func TestTimelineOverlapAndHeld(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tl := Timeline{Start: t0, Series: map[string][]Change{
		// Ready until 4 s, False until 30 s, True again.
		SigReady: {{At: at(0), Value: "True"}, {At: at(4), Value: "False"}, {At: at(30), Value: "True"}},
		// Requests fail from 1.5 s to 28 s.
		SigServing: {{At: at(0), Value: "ok"}, {At: at(1.5), Value: "fail"}, {At: at(28), Value: "ok"}},
	}}
	tests := []struct {
		name     string
		got      time.Duration
		want     time.Duration
		from, to float64
	}{
		{name: "Ready while failing, whole run", got: tl.Overlap(SigReady, "True", SigServing, "fail", at(0), at(40)), want: 2500 * time.Millisecond},
		{name: "not Ready while serving", got: tl.Overlap(SigReady, "False", SigServing, "ok", at(0), at(40)), want: 2 * time.Second},
		{name: "window cuts the overlap", got: tl.Overlap(SigReady, "True", SigServing, "fail", at(3), at(40)), want: time.Second},
		{name: "failing within a window", got: tl.Held(SigServing, "fail", at(10), at(20)), want: 10 * time.Second},
		{name: "nothing before the first change", got: tl.Held(SigServing, "fail", at(-5), at(1)), want: 0},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, tc.got, tc.want)
		}
	}
	if got, ok := tl.FirstBoth(SigReady, "True", SigServing, "ok", at(2)); !ok || !got.Equal(at(30)) {
		t.Errorf("FirstBoth(Ready, serving) after 2 s = %v %v, want 30 s (served again at 28 s, Ready at 30 s)", got.Sub(t0), ok)
	}
	if got, ok := tl.FirstBoth(SigReady, "False", SigServing, "ok", at(10)); !ok || !got.Equal(at(28)) {
		t.Errorf("FirstBoth(not Ready, serving) after 10 s = %v %v, want 28 s", got.Sub(t0), ok)
	}
	if got, ok := tl.FirstBoth(SigReady, "True", SigServing, "ok", at(0)); !ok || !got.Equal(at(0)) {
		t.Errorf("FirstBoth at a moment both already hold = %v %v, want 0 s", got.Sub(t0), ok)
	}
	if _, ok := tl.FirstBoth(SigReady, "False", SigServing, "no-address", at(0)); ok {
		t.Error("FirstBoth found a moment that never was")
	}
	if v := tl.ValueAt(SigReady, at(5)); v != "False" {
		t.Errorf("ValueAt(5s) = %q, want False", v)
	}
	if v := tl.ValueAt(SigReady, at(-1)); v != "" {
		t.Errorf("ValueAt before the first change = %q, want empty", v)
	}
}

func TestTimelineBoot(t *testing.T) {
	t0 := time.Unix(2000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tl := Timeline{Start: t0, Series: map[string][]Change{
		SigEvent:   {{At: at(1), Value: "defined"}, {At: at(2), Value: "started"}, {At: at(50), Value: "stopped"}, {At: at(51), Value: "started"}},
		SigAgent:   {{At: at(0), Value: "down"}, {At: at(25), Value: "up"}, {At: at(50), Value: "down"}, {At: at(70), Value: "up"}},
		SigLease:   {{At: at(20), Value: "10.77.0.150"}},
		SigAddress: {{At: at(0), Value: ""}, {At: at(21), Value: "10.77.0.150"}},
		SigServing: {{At: at(0), Value: "no-address"}, {At: at(20), Value: "fail"}, {At: at(40), Value: "ok"}, {At: at(50), Value: "fail"}, {At: at(80), Value: "ok"}},
		SigReady:   {{At: at(0), Value: "False"}, {At: at(40.6), Value: "True"}, {At: at(50.5), Value: "False"}, {At: at(81), Value: "True"}},
		// The first 204 took 0.4 s to come back.
		SigAnswered: {{At: at(20.1), Value: "fail"}, {At: at(40.4), Value: "ok"}, {At: at(50.1), Value: "fail"}, {At: at(80.2), Value: "ok"}},
	}}
	s := func(d float64) time.Duration { return time.Duration(d * float64(time.Second)) }

	first := tl.Boot(t0)
	want := BootTimes{From: t0, Defined: s(1), Started: s(2), Agent: s(25), Lease: s(20), Address: s(21), FirstServed: s(40), FirstAnswer: s(40.4), Ready: s(40.6)}
	if first != want {
		t.Errorf("first boot:\n got %+v\nwant %+v", first, want)
	}
	if got := first.BootToAgent(); got != s(23) {
		t.Errorf("BootToAgent = %s, want 23s", got)
	}
	if got := first.Lag(); got != s(0.6) {
		t.Errorf("Lag = %s, want 600ms", got)
	}
	if got := first.AnswerLag(); got != s(0.2) {
		t.Errorf("AnswerLag = %s, want 200ms", got)
	}

	// A restart after a destroy at 50 s: no new define, no new lease.
	again := tl.Boot(at(50))
	if again.Defined != 0 || again.Lease != 0 || again.Address != 0 {
		t.Errorf("a restart has no define, lease or address change: %+v", again)
	}
	if again.Started != s(1) || again.BootToAgent() != s(19) || again.FirstServed != s(30) || again.Ready != s(31) {
		t.Errorf("restart: %s", again)
	}
	if str := again.String(); !strings.Contains(str, "defined +-") || !strings.Contains(str, "lag 1.0s") {
		t.Errorf("String() = %q", str)
	}
	if lag := (BootTimes{Ready: s(3)}).Lag(); lag != 0 {
		t.Errorf("Lag without a first served = %s, want 0 (unknown)", lag)
	}
}

func TestServingSeriesOrdersRequestsByStart(t *testing.T) {
	t0 := time.Unix(3000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	o := &Observer{start: t0, series: map[string][]Change{}}
	// Requests end out of order: the one started at 1 s hung until its
	// timeout and ended after those started at 2 s and 3 s; the one
	// started at 4 s took 1.5 s to be answered.
	o.serve(Change{At: at(-1), Value: "no-address"}, time.Time{})
	o.serve(Change{At: at(0), Value: "ok"}, at(0.1))
	o.serve(Change{At: at(2), Value: "fail"}, at(2.1))
	o.serve(Change{At: at(3), Value: "fail"}, at(3.1))
	o.serve(Change{At: at(1), Value: "fail"}, at(6))
	o.serve(Change{At: at(4), Value: "ok"}, at(5.5))
	tl := o.Timeline()
	for _, tc := range []struct {
		sig  string
		want []Change
	}{
		{SigServing, []Change{{At: at(-1), Value: "no-address"}, {At: at(0), Value: "ok"}, {At: at(1), Value: "fail"}, {At: at(4), Value: "ok"}}},
		// By their ends: the request sent at 4 s is the first answered
		// after the failures, at 5.5 s; the hung one failed after it.
		{SigAnswered, []Change{{At: at(0.1), Value: "ok"}, {At: at(2.1), Value: "fail"}, {At: at(5.5), Value: "ok"}, {At: at(6), Value: "fail"}}},
	} {
		got := tl.Series[tc.sig]
		if len(got) != len(tc.want) {
			t.Fatalf("%s: series %+v, want %+v", tc.sig, got, tc.want)
		}
		for i := range tc.want {
			if !got[i].At.Equal(tc.want[i].At) || got[i].Value != tc.want[i].Value {
				t.Errorf("%s change %d: %+v, want %+v", tc.sig, i, got[i], tc.want[i])
			}
		}
	}
	if got, ok := tl.FirstValue(SigAnswered, "ok", at(1)); !ok || !got.Equal(at(5.5)) {
		t.Errorf("first answer after 1 s = %v %v, want 5.5 s", got.Sub(t0), ok)
	}
	if n := o.Requests(); n != 5 {
		t.Errorf("Requests() = %d, want 5 (no request without an address)", n)
	}
}

func TestTimelineLeft(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	steady := Timeline{Start: t0, Series: map[string][]Change{
		SigReady: {{At: at(0), Value: ""}, {At: at(1), Value: "False"}, {At: at(9), Value: "True"}},
	}}
	if got := steady.Left(SigReady, "True", at(9)); len(got) != 0 {
		t.Errorf("steady after Ready: %v, want none", got)
	}
	if got := steady.Left(SigReady, "True", at(0.5)); len(got) != 1 || got[0].Value != "False" {
		t.Errorf("from before the first False: %v, want the False at 1 s", got)
	}
	flap := Timeline{Start: t0, Series: map[string][]Change{
		SigReady: {{At: at(9), Value: "True"}, {At: at(20), Value: "False", Detail: "ProbeFailed"}, {At: at(50), Value: "True"}},
	}}
	if got := flap.Left(SigReady, "True", at(9)); len(got) != 1 || !got[0].At.Equal(at(20)) || got[0].Detail != "ProbeFailed" {
		t.Errorf("flap: %v, want the False at 20 s", got)
	}
}
