package e2eutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFaultRowMarkdown(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		row  FaultRow
		want string
	}{{
		name: "held, measured both ways, a message with a pipe and a line break",
		row: func() FaultRow {
			r := FaultRow{N: 14, Fault: "leader deleted", Invariant: "Ready once", Survived: true}
			r.Detected(t0, t0.Add(17500*time.Millisecond), "pod deleted → new leader")
			r.Recovered(t0, t0.Add(88200*time.Millisecond), "")
			r.Note("reason: %s", "a|b\nc")
			r.Note("second")
			return r
		}(),
		want: `| 14 | leader deleted | Ready once | yes | 17.5s (pod deleted → new leader) | 88.2s | 0 | 0 instances, 0 volumes, 0 NVRAM | 0 | reason: a\|b c; second |` + "\n",
	}, {
		name: "failed, nothing timed, a Proxy lost, leaks and another install's objects",
		row: FaultRow{N: 2, Fault: "f", Invariant: "i", ProxiesLost: []string{"p1"},
			Audit:   Audit{LeakedDomains: []string{"d1"}, ForeignTouched: []string{"x"}},
			Touched: []string{"vol a"}},
		want: "| 2 | f | i | **no** | n/a | n/a | 1 (p1) | 1 instances (d1), 0 volumes, 0 NVRAM | 1 (x); other install's: 1 (vol a) |  |\n",
	}, {
		name: "not audited",
		row:  FaultRow{N: 3, Fault: "f", Invariant: "i", Survived: true, AuditErr: "host gone"},
		want: "| 3 | f | i | yes | n/a | n/a | 0 | not audited: host gone | not audited |  |\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.row.Markdown(); got != tc.want {
				t.Errorf("Markdown() =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestWriteFaultRowWritesTheHeaderOnce(t *testing.T) {
	dir := t.TempDir()
	for n := 1; n <= 2; n++ {
		if err := WriteFaultRow(dir, &FaultRow{N: n, Fault: "f", Invariant: "i", Survived: true}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "faults.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 4 || lines[0]+"\n"+lines[1]+"\n" != FaultsHeader || !strings.HasPrefix(lines[2], "| 1 |") || !strings.HasPrefix(lines[3], "| 2 |") {
		t.Fatalf("faults.md =\n%s", b)
	}
}
