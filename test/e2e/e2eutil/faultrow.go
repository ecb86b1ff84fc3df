package e2eutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// FaultRow is one row of faults.md, the table docs/reliability.md carries:
// a fault, the invariant checked, whether it held, how fast the fault was
// seen and repaired, and what was lost or leaked. The fault suite writes
// one per fault; the cluster suite writes the leader failover's.
type FaultRow struct {
	N                       int
	Fault, Invariant        string
	Survived                bool
	Detect, Recover         time.Duration
	DetectNote, RecoverNote string
	ProxiesLost             []string
	Audit                   Audit
	AuditErr                string
	// Touched lists objects of another install the fault changed.
	Touched []string
	Notes   []string
}

// Note appends a free-text note.
func (r *FaultRow) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// Detected records the time to detect: from the fault to at, the first
// state that showed it.
func (r *FaultRow) Detected(from, at time.Time, note string) {
	r.Detect, r.DetectNote = at.Sub(from), note
}

// Recovered records the time to recover: from the repair (or the fault,
// for faults the operator repairs itself) to at.
func (r *FaultRow) Recovered(from, at time.Time, note string) {
	r.Recover, r.RecoverNote = at.Sub(from), note
}

// FaultsHeader is the table's header, written before its first row.
const FaultsHeader = "| # | fault | invariant checked | survived | time to detect | time to recover | Proxies lost | instances / volumes / NVRAM leaked | foreign objects touched | notes |\n" +
	"| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"

// Markdown is the row as one table line; a cell's "|" and line breaks are
// escaped so that no message can break the table.
func (r *FaultRow) Markdown() string {
	dur := func(d time.Duration, note string) string {
		if d == 0 {
			return "n/a"
		}
		s := Seconds(d)
		if note != "" {
			s += " (" + note + ")"
		}
		return s
	}
	survived := "yes"
	if !r.Survived {
		survived = "**no**"
	}
	lost := fmt.Sprint(len(r.ProxiesLost))
	if len(r.ProxiesLost) > 0 {
		lost += " (" + strings.Join(r.ProxiesLost, ", ") + ")"
	}
	leaked, touched := r.Audit.String(), r.Audit.ForeignString()
	if r.AuditErr != "" {
		leaked, touched = "not audited: "+r.AuditErr, "not audited"
	}
	if len(r.Touched) > 0 {
		touched = fmt.Sprintf("%s; other install's: %d (%s)", touched, len(r.Touched), strings.Join(r.Touched, "; "))
	}
	cell := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ") }
	return "| " + strings.Join([]string{fmt.Sprint(r.N), cell(r.Fault), cell(r.Invariant), survived,
		cell(dur(r.Detect, r.DetectNote)), cell(dur(r.Recover, r.RecoverNote)), cell(lost), cell(leaked), cell(touched),
		cell(strings.Join(r.Notes, "; "))}, " | ") + " |\n"
}

// WriteFaultRow appends r to dir/faults.md, with the header first.
func WriteFaultRow(dir string, r *FaultRow) error {
	path := filepath.Join(dir, "faults.md")
	_, err := os.Stat(path)
	f, ferr := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if ferr != nil {
		return ferr
	}
	defer f.Close()
	if errors.Is(err, os.ErrNotExist) {
		if _, err := f.WriteString(FaultsHeader); err != nil {
			return err
		}
	}
	_, err = f.WriteString(r.Markdown())
	return err
}
