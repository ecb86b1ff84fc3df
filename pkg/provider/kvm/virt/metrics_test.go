package virt_test

import (
	"context"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

func TestPrometheusObserver(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	obs, err := virt.NewPrometheusObserver(reg)
	if err != nil {
		t.Fatal(err)
	}
	// A second client on the same registry shares the collectors.
	obs2, err := virt.NewPrometheusObserver(reg)
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}

	f := newHost(t)
	seed(t, f, false)
	c := virt.Instrument(context.Background(), f, virt.WithObserver(obs))
	_, _ = c.DomainLookupByName("a")
	_, _ = c.DomainLookupByName("missing")
	_, _ = virt.Instrument(context.Background(), f, virt.WithObserver(obs2)).DomainLookupByName("missing")
	ctx, cancel := context.WithCancel(context.Background())
	release := f.Block(virt.RPCConnectGetHostname)
	go func() {
		for f.Blocked(virt.RPCConnectGetHostname) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	_, _ = virt.Instrument(ctx, f, virt.WithObserver(obs)).ConnectGetHostname()
	release()

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range families {
		byName[mf.GetName()] = mf
	}
	labels := func(m *dto.Metric) map[string]string {
		out := map[string]string{}
		for _, l := range m.GetLabel() {
			out[l.GetName()] = l.GetValue()
		}
		return out
	}

	hist := byName["proxy_operator_libvirt_rpc_duration_seconds"]
	if hist == nil {
		t.Fatal("histogram missing")
	}
	counts := map[string]uint64{}
	for _, m := range hist.GetMetric() {
		counts[labels(m)["rpc"]] = m.GetHistogram().GetSampleCount()
	}
	if counts[virt.RPCDomainLookupByName] != 3 || counts[virt.RPCConnectGetHostname] != 1 {
		t.Errorf("histogram counts %v", counts)
	}

	errs := byName["proxy_operator_libvirt_rpc_errors_total"]
	if errs == nil {
		t.Fatal("error counter missing")
	}
	got := map[[2]string]float64{}
	for _, m := range errs.GetMetric() {
		l := labels(m)
		got[[2]string{l["rpc"], l["code"]}] = m.GetCounter().GetValue()
	}
	want := map[[2]string]float64{
		{virt.RPCDomainLookupByName, libvirt.ErrNoDomain.String()}: 2,
		{virt.RPCConnectGetHostname, "Canceled"}:                   1,
	}
	if len(got) != len(want) {
		t.Errorf("error series %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("errors%v = %v, want %v", k, got[k], v)
		}
	}
}
