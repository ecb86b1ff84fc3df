package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func template() *crawlv1.ProxyTemplate {
	mem := resource.MustParse("512Mi")
	return &crawlv1.ProxyTemplate{
		Metadata: crawlv1.ProxyTemplateMeta{Labels: map[string]string{"pool": "crawl-a", "team": "x"}},
		Spec: crawlv1.ProxySpec{
			Provider:  crawlv1.ProviderKVM,
			Placement: crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "1"}}, Image: "debian-12"},
			Resources: crawlv1.ProxyResources{CPUs: 1, Memory: &mem},
			Access:    &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.244.0.0/16"}},
		},
	}
}

func TestTemplateHash(t *testing.T) {
	base := TemplateHash(template())
	// Pinned: a change to how the hash is computed would roll every
	// replica of every pool on upgrade. Change it only on purpose.
	if want := goldenHash; base != want {
		t.Errorf("hash of the reference template changed: %s, was %s; every pool would roll on upgrade", base, want)
	}

	// The same template read back from the API server (JSON round trip,
	// maps in another order, a quantity spelled differently).
	b, _ := json.Marshal(template())
	var back crawlv1.ProxyTemplate
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	back.Metadata.Labels = map[string]string{"team": "x", "pool": "crawl-a"}
	q := resource.MustParse("0.5Gi")
	back.Spec.Resources.Memory = &q
	if got := TemplateHash(&back); got != base {
		t.Errorf("the same template read back hashes to %s, not %s", got, base)
	}

	// Empty values spelled out (as a newer API might serialise them) do
	// not count.
	var generic map[string]any
	_ = json.Unmarshal(b, &generic)
	generic["spec"].(map[string]any)["cloudInit"] = map[string]any{"userData": ""}
	generic["spec"].(map[string]any)["futureField"] = map[string]any{"enabled": false, "items": []any{}}
	b, _ = json.Marshal(generic)
	var spelled crawlv1.ProxyTemplate
	_ = json.Unmarshal(b, &spelled)
	if got := TemplateHash(&spelled); got != base {
		t.Errorf("empty values spelled out change the hash: %s, not %s", got, base)
	}
	if h := hashJSON(t, b); h != base {
		t.Errorf("an unknown empty field changes the canonical hash: %s, not %s", h, base)
	}

	for name, change := range map[string]func(*crawlv1.ProxyTemplate){
		"image":      func(t *crawlv1.ProxyTemplate) { t.Spec.Placement.Image = "debian-13" },
		"label":      func(t *crawlv1.ProxyTemplate) { t.Metadata.Labels["team"] = "y" },
		"annotation": func(t *crawlv1.ProxyTemplate) { t.Metadata.Annotations = map[string]string{"a": "b"} },
		"cpus":       func(t *crawlv1.ProxyTemplate) { t.Spec.Resources.CPUs = 2 },
		"access":     func(t *crawlv1.ProxyTemplate) { t.Spec.Access.AllowedPorts = []int32{443} },
	} {
		tpl := template()
		change(tpl)
		if TemplateHash(tpl) == base {
			t.Errorf("changing the %s does not change the hash", name)
		}
	}
}

// goldenHash is TemplateHash(template()).
const goldenHash = "626d7c76215b4f71"

func TestJitterOf(t *testing.T) {
	const jitter = 10 * time.Minute
	buckets := make([]int, 10)
	for i := range 1000 {
		uid := fmt.Sprintf("0d5e3a9c-1b2f-4c6d-8e7f-%012d", i)
		j := JitterOf(uid, jitter)
		if j < 0 || j >= jitter {
			t.Fatalf("%s: jitter %s outside [0, %s)", uid, j, jitter)
		}
		if JitterOf(uid, jitter) != j {
			t.Fatalf("%s: not fixed per replica", uid)
		}
		buckets[int(j*10/jitter)]++
	}
	for i, n := range buckets {
		if n < 50 {
			t.Errorf("only %d of 1000 replicas in the %d. tenth of the jitter: not spread (%v)", n, i+1, buckets)
		}
	}
	if JitterOf("x", 0) != 0 {
		t.Error("no jitter configured, yet jitter")
	}
}

func TestReplicaFrom(t *testing.T) {
	created := metav1.NewTime(t0.Add(-time.Hour))
	readyAt := metav1.NewTime(t0.Add(-50 * time.Minute))
	p := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{
			Name: "pool-abcde", UID: types.UID("u1"), CreationTimestamp: created,
			Labels: map[string]string{crawlv1.TemplateHashLabel: "h1"},
			Annotations: map[string]string{
				crawlv1.DeleteProxyAnnotation:     "",
				crawlv1.DrainingAnnotation:        FormatTime(t0.Add(-1500 * time.Millisecond)),
				crawlv1.RotationAnnotation:        "yesterday",
				crawlv1.StartupFailuresAnnotation: "3",
				crawlv1.ReplacesAnnotation:        "pool-xxxxx",
			},
		},
		Status: crawlv1.ProxyStatus{Host: "hv1", EgressAddress: "203.0.113.7", Conditions: []metav1.Condition{
			{Type: crawlv1.ReadyCondition, Status: metav1.ConditionTrue, LastTransitionTime: readyAt}}},
	}
	r := ReplicaFrom(p, "h1")
	want := Replica{Name: "pool-abcde", UID: "u1", Created: created.Time, Ready: true, ReadyChanged: readyAt.Time, UpToDate: true,
		Marked: true, DrainingSince: t0.Add(-1500 * time.Millisecond), RotatingSince: time.Unix(1, 0), StartupFailures: 3,
		Replaces: "pool-xxxxx", Host: "hv1", EgressAddress: "203.0.113.7"}
	if fmt.Sprintf("%+v", r) != fmt.Sprintf("%+v", want) {
		t.Errorf("got  %+v\nwant %+v", r, want)
	}
	if ReplicaFrom(p, "h2").UpToDate {
		t.Error("another template's replica is up to date")
	}
	deleted := metav1.NewTime(t0.Add(-time.Minute))
	p.DeletionTimestamp = &deleted
	p.Status.Conditions = append(p.Status.Conditions, metav1.Condition{Type: crawlv1.DeletionBlockedCondition, Status: metav1.ConditionTrue})
	if r := ReplicaFrom(p, "h1"); !r.DeletingSince.Equal(deleted.Time) || !r.DeletionStuck {
		t.Errorf("deleting since %s, stuck %v; want since %s, stuck (DeletionBlocked)", r.DeletingSince, r.DeletionStuck, deleted.Time)
	}
	p.DeletionTimestamp = nil
	p.Status.Conditions = nil
	if r := ReplicaFrom(p, "h1"); r.Ready || !r.ReadyChanged.Equal(created.Time) {
		t.Errorf("no Ready condition: Ready %v since %s, want false since creation", r.Ready, r.ReadyChanged)
	}
}

// hashJSON hashes raw JSON as TemplateHash does after marshalling, for
// fields the Go type does not have yet.
func hashJSON(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(pruneEmpty(v))
	sum := sha256.Sum256(out)
	return hex.EncodeToString(sum[:8])
}
