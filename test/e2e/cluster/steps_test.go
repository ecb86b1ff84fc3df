package cluster

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestGettingStartedShowsTheSteps: every command the cluster suite runs as
// a user would appears in docs/getting-started.md, in the suite's order, so
// the page says what `make test-e2e-cluster` proves.
func TestGettingStartedShowsTheSteps(t *testing.T) {
	_, self, _, _ := runtime.Caller(0)
	page, err := os.ReadFile(filepath.Join(filepath.Dir(self), "..", "..", "..", "docs", "getting-started.md"))
	if err != nil {
		t.Fatal(err)
	}
	if missing := stepsMissing(string(page)); len(missing) > 0 {
		t.Errorf("docs/getting-started.md does not show, in this order: %q", missing)
	}
	if stepsMissing("kubectl apply -k my-install") == nil {
		t.Error("the check cannot fail: a page without the steps passed")
	}
}

// stepsMissing lists the steps page lacks, each looked for after the
// previous one.
func stepsMissing(page string) []string {
	var missing []string
	rest := page
	for _, s := range InstallSteps {
		cmd := strings.Join(s, " ")
		i := strings.Index(rest, cmd)
		if i < 0 {
			missing = append(missing, cmd)
			continue
		}
		rest = rest[i+len(cmd):]
	}
	return missing
}
