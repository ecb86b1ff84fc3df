package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// openProxyRule is a squid rule that admits every client: applied as
// shipped, it makes an open proxy, which strangers find and abuse within
// hours. Matched case-insensitively and whatever the spacing, as squid reads it.
var openProxyRule = regexp.MustCompile(`(?i)http_access\s+allow\s+all\b`)

// TestNothingShippedMakesAnOpenProxy reads every file users copy from
// (samples, manifests, templates, docs, README): none may admit all clients.
func TestNothingShippedMakesAnOpenProxy(t *testing.T) {
	root := filepath.Join("..", "..")
	var checked int
	for _, dir := range []string{"config", "templates", "docs", "README.md"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			checked++
			if loc := openProxyRule.FindIndex(data); loc != nil {
				t.Errorf("%s: %q admits every client (an open proxy); admit the crawler's source CIDRs only", path, data[loc[0]:loc[1]])
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 10 {
		t.Fatalf("only %d files checked: the walk is not reading the shipped tree", checked)
	}
}
