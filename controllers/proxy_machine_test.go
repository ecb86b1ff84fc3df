package controllers

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func TestSelectHost(t *testing.T) {
	host := func(name string, ready bool, labels map[string]string) *crawlv1.KVMHost {
		status := metav1.ConditionFalse
		if ready {
			status = metav1.ConditionTrue
		}
		return &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Status: crawlv1.KVMHostStatus{Conditions: []metav1.Condition{{Type: crawlv1.ReadyCondition, Status: status}}}}
	}
	onHost := func(name, h string) *crawlv1.Proxy {
		return &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Status: crawlv1.ProxyStatus{Host: h}}
	}
	rackA := map[string]string{"rack": "a"}
	cases := []struct {
		name     string
		objs     []runtime.Object
		wantHost string
		wantWait bool
	}{
		{"fewest proxies wins", []runtime.Object{host("hv1", true, rackA), host("hv2", true, rackA), onHost("x", "hv1")}, "hv2", false},
		{"name breaks ties", []runtime.Object{host("hv2", true, rackA), host("hv1", true, rackA)}, "hv1", false},
		{"not Ready is skipped", []runtime.Object{host("hv1", false, rackA), host("hv2", true, rackA), onHost("x", "hv2")}, "hv2", false},
		{"labels must match", []runtime.Object{host("hv1", true, map[string]string{"rack": "b"})}, "", true},
		{"no Ready host waits", []runtime.Object{host("hv1", false, rackA)}, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := runtime.NewScheme()
			_ = crawlv1.AddToScheme(s)
			c := fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(tc.objs...).WithStatusSubresource(&crawlv1.KVMHost{}, &crawlv1.Proxy{}).Build()
			r := &ProxyReconciler{Client: c}
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "new"},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: rackA}}}}
			got, wait, err := r.selectHost(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.wantHost || (wait != nil) != tc.wantWait {
				t.Fatalf("selectHost = %q, wait %+v; want %q, wait %v", got, wait, tc.wantHost, tc.wantWait)
			}
			if wait != nil && wait.reason != crawlv1.ProxyWaitingForHostReason {
				t.Fatalf("wait reason %q", wait.reason)
			}
		})
	}
}

// A pool's replicas carry the pool's name to the provider, which spreads
// them over nodes (kubernetes); a Proxy of no pool spreads with nothing.
func TestMachineSpreadGroupIsThePool(t *testing.T) {
	p := &crawlv1.Proxy{}
	p.Labels = map[string]string{crawlv1.PoolNameLabel: "crawl-a"}
	if g := baseMachine(p, "t").SpreadGroup; g != "crawl-a" {
		t.Fatalf("SpreadGroup = %q, want the pool's name", g)
	}
	if g := baseMachine(&crawlv1.Proxy{}, "t").SpreadGroup; g != "" {
		t.Fatalf("SpreadGroup of a standalone Proxy = %q", g)
	}
}
