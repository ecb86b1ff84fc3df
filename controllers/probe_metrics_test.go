package controllers

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// probeMetric sums the manager's metric name over key's series (and
// those with the further label pairs), and counts them.
func probeMetric(tb testing.TB, name string, key types.NamespacedName, labelPairs ...string) (sum float64, series int) {
	tb.Helper()
	want := map[string]string{"namespace": key.Namespace, "proxy": key.Name}
	for i := 0; i+1 < len(labelPairs); i += 2 {
		want[labelPairs[i]] = labelPairs[i+1]
	}
	// Other collectors' errors (e.g. a stopped suite's) leave this one's
	// families in the answer.
	mfs, err := metrics.Registry.Gather()
	if err != nil && len(mfs) == 0 {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			matched := 0
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
					matched++
				}
			}
			if matched == len(want) {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
				series++
			}
		}
	}
	return sum, series
}
