package harness

import (
	"context"
	"net/http"
	"testing"

	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

// TestProberAgreesWithItsDial checks that the probe and the port watch's
// dial see the same port state, and that probes are counted per address.
func TestProberAgreesWithItsDial(t *testing.T) {
	ctx := context.Background()
	p := NewProber()
	up, down := proxyprobe.Target{Address: "192.0.2.1", Port: 3128}, proxyprobe.Target{Address: "192.0.2.2", Port: 3128}
	p.SetDown(down.Address, true)

	for _, tc := range []struct {
		target proxyprobe.Target
		serves bool
	}{{up, true}, {down, false}} {
		if r := p.Probe(ctx, tc.target); r.OK != tc.serves || (r.Err == nil) != tc.serves {
			t.Errorf("Probe(%s) = %+v, want serving %v", tc.target.Address, r, tc.serves)
		}
		c, err := p.Dial(ctx, "tcp", tc.target.Address+":3128")
		if (err == nil) != tc.serves {
			t.Errorf("Dial(%s) error %v, want serving %v", tc.target.Address, err, tc.serves)
		}
		if c != nil {
			_ = c.Close()
		}
	}

	p.SetDown(down.Address, false)
	if r := p.Probe(ctx, down); !r.OK {
		t.Errorf("Probe(%s) after SetDown false = %+v, want OK", down.Address, r)
	}
	if n := p.Probes(down.Address); n != 2 {
		t.Errorf("Probes(%s) = %d, want 2 (failed probes count too)", down.Address, n)
	}
	if n := p.Probes("192.0.2.3"); n != 0 {
		t.Errorf("Probes of an address never probed = %d", n)
	}
	if r := p.ProbeWithoutCredentials(ctx, up); r.StatusCode != http.StatusProxyAuthRequired || !r.Through {
		t.Errorf("ProbeWithoutCredentials = %+v, want 407 through the proxy", r)
	}
}
