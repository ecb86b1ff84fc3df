package logkeys

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapJSON is the manager's encoder (JSON lines) into buf.
func zapJSON(buf *bytes.Buffer) logr.Logger {
	enc := zapcore.NewJSONEncoder(zapcore.EncoderConfig{MessageKey: "msg", LevelKey: "level", NameKey: "logger", CallerKey: "caller",
		EncodeLevel: zapcore.LowercaseLevelEncoder, EncodeCaller: zapcore.ShortCallerEncoder})
	core := zapcore.NewCore(enc, zapcore.AddSync(buf), zapcore.DebugLevel)
	return zapr.NewLogger(zap.New(core, zap.AddCaller()))
}

// keysOf returns the keys of one JSON line in order, repeats included
// (encoding/json's map decoding would hide them).
func keysOf(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func TestNoKeyRepeatedOnALine(t *testing.T) {
	cases := []struct {
		name     string
		log      func(l logr.Logger)
		wantKeys []string
		want     map[string]any
	}{
		{"controller and pool both add host", func(l logr.Logger) {
			l.WithValues("controller", "kvmhost", "host", "hv1").WithValues("host", "hv1").Info("connected to kvm host", "address", "10.0.0.1:22")
		}, []string{"level", "msg", "controller", "host", "address"}, map[string]any{"host": "hv1", "address": "10.0.0.1:22"}},
		{"the innermost value wins, at the first position", func(l logr.Logger) {
			l.WithValues("image", "debian", "pool", "default").Info("Image cached", "image", "debian (sha256:ab12)", "bytes", 3)
		}, []string{"level", "msg", "image", "pool", "bytes"}, map[string]any{"image": "debian (sha256:ab12)", "bytes": 3.0}},
		{"repeats within one call", func(l logr.Logger) {
			l.Info("x", "k", 1, "k", 2)
		}, []string{"level", "msg", "k"}, map[string]any{"k": 2.0}},
		{"names and errors pass through", func(l logr.Logger) {
			l.WithName("kvm").WithValues("host", "a").Error(errTest, "dial failed", "host", "a", "stage", "TCPUnreachable")
		}, []string{"level", "logger", "msg", "host", "stage", "error"}, map[string]any{"logger": "kvm", "stage": "TCPUnreachable"}},
		{"V levels pass through", func(l logr.Logger) {
			l.V(1).WithValues("rpc", "DomainLookupByName").Info("libvirt call", "rpc", "DomainLookupByName")
		}, []string{"level", "msg", "rpc"}, map[string]any{"level": "debug"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tc.log(Wrap(zapJSON(&buf)))
			line := strings.TrimSpace(buf.String())
			keys := keysOf(t, line)
			keys = without(keys, "caller")
			if strings.Join(keys, ",") != strings.Join(tc.wantKeys, ",") {
				t.Fatalf("keys %v, want %v\nline: %s", keys, tc.wantKeys, line)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(line), &got); err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
		})
	}
}

// TestCallerIsTheCallSite: the wrapper must not make every line's caller
// this package.
func TestCallerIsTheCallSite(t *testing.T) {
	var buf bytes.Buffer
	Wrap(zapJSON(&buf)).WithValues("a", 1).Info("here")
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if c, _ := got["caller"].(string); !strings.HasPrefix(c, "logkeys/logkeys_test.go") {
		t.Fatalf("caller %q, want this test file", c)
	}
}

type testErr struct{}

func (testErr) Error() string { return "boom" }

var errTest = testErr{}

func without(keys []string, drop string) []string {
	var out []string
	for _, k := range keys {
		if k != drop {
			out = append(out, k)
		}
	}
	return out
}
