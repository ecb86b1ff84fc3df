package e2eutil

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func TestViaURLAndMaskURL(t *testing.T) {
	for _, tc := range []struct {
		line, endpoint, user, masked string
		wantErr                      bool
	}{
		{line: "http://crawl-ab12c:s3cr%2Ft@10.77.0.5:3128", endpoint: "http://10.77.0.5:3128", user: "crawl-ab12c", masked: "http://crawl-ab12c:xxxxx@10.77.0.5:3128"},
		{line: "http://10.77.0.5:3128", endpoint: "http://10.77.0.5:3128", masked: "http://10.77.0.5:3128"},
		{line: "https://u:p@10.77.0.5:3128", wantErr: true, masked: "https://u:xxxxx@10.77.0.5:3128"},
		{line: "http://u:p@10.77.0.5:3128/path", wantErr: true, masked: "http://u:xxxxx@10.77.0.5:3128/path"},
		{line: "http://u:p@[::1", wantErr: true, masked: "(unparsable line)"},
	} {
		via, err := ViaURL(tc.line)
		if (err != nil) != tc.wantErr {
			t.Errorf("ViaURL(%q) error %v, want error %v", tc.line, err, tc.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), ":p@") {
			t.Errorf("ViaURL(%q) error %q carries the password", tc.line, err)
		}
		if err == nil {
			if via.Endpoint != tc.endpoint {
				t.Errorf("ViaURL(%q).Endpoint = %q, want %q", tc.line, via.Endpoint, tc.endpoint)
			}
			if got := via.Credentials.Username(); tc.user != "" && got != tc.user {
				t.Errorf("ViaURL(%q) user %q, want %q", tc.line, got, tc.user)
			}
			if tc.user != "" {
				if p, _ := via.Credentials.Password(); p != "s3cr/t" {
					t.Errorf("ViaURL(%q) password %q, want the unescaped one", tc.line, p)
				}
			}
		}
		if got := MaskURL(tc.line); got != tc.masked {
			t.Errorf("MaskURL(%q) = %q, want %q", tc.line, got, tc.masked)
		}
	}
}

func replica(name string, ready, draining, deleting bool) *crawlv1.Proxy {
	p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: k8stypes.UID("uid-" + name)}}
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	p.Status.Conditions = []metav1.Condition{{Type: crawlv1.ReadyCondition, Status: status}}
	if draining {
		p.Annotations = map[string]string{crawlv1.DrainingAnnotation: time.Now().Format(time.RFC3339)}
	}
	if deleting {
		p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	}
	return p
}

// The watch bounds what the pool does (taking replicas out, creating) and
// records, without counting it against the pool, Ready lost by a replica in
// service.
func TestPoolWatchBudget(t *testing.T) {
	type ev struct {
		t watch.EventType
		p *crawlv1.Proxy
	}
	for _, tc := range []struct {
		name                       string
		events                     []ev
		violations, lost, disrupts int
		minAvailable, minAtDisrupt int
		// reported: replicas a ban report asked to replace.
		reported    []string
		reportedOut int
	}{{
		name: "a rollout step within the budget: surge, drain, delete",
		events: []ev{
			{watch.Added, replica("new", false, false, false)},
			{watch.Modified, replica("new", true, false, false)},
			{watch.Modified, replica("a", true, true, false)},
			{watch.Modified, replica("a", true, true, true)},
			{watch.Deleted, replica("a", true, true, true)},
		},
		disrupts: 1, minAvailable: 3, minAtDisrupt: 3,
	}, {
		name: "draining before the new replica is Ready breaks it",
		events: []ev{
			{watch.Added, replica("new", false, false, false)},
			{watch.Modified, replica("a", true, true, false)},
		},
		violations: 1, disrupts: 1, minAvailable: 2, minAtDisrupt: 2,
	}, {
		name: "a second surge breaks it",
		events: []ev{
			{watch.Added, replica("new", false, false, false)},
			{watch.Added, replica("new2", false, false, false)},
		},
		violations: 1, minAvailable: 3, minAtDisrupt: 3,
	}, {
		name: "Ready lost in service is recorded, not the pool's violation",
		events: []ev{
			{watch.Modified, replica("b", false, false, false)},
			{watch.Modified, replica("b", true, false, false)},
		},
		lost: 1, minAvailable: 2, minAtDisrupt: 3,
	}, {
		name: "replacing a replica that lost Ready first is within the budget",
		events: []ev{
			{watch.Added, replica("new", false, false, false)},
			{watch.Modified, replica("c", false, false, false)},
			{watch.Modified, replica("c", false, true, false)},
			{watch.Modified, replica("c", true, true, false)},
			{watch.Deleted, replica("c", true, true, true)},
		},
		lost: 1, disrupts: 1, minAvailable: 2, minAtDisrupt: 3,
	}, {
		name: "deleting a replica in service with one lost Ready breaks it",
		events: []ev{
			{watch.Modified, replica("b", false, false, false)},
			{watch.Deleted, replica("c", true, false, false)},
		},
		violations: 1, lost: 1, disrupts: 1, minAvailable: 1, minAtDisrupt: 1,
	}, {
		name: "a replica a ban report asked to replace leaves at once, outside the budget",
		events: []ev{
			{watch.Modified, replica("a", true, true, false)},
			{watch.Added, replica("new", false, false, false)},
			{watch.Modified, replica("new", true, false, false)},
			{watch.Deleted, replica("a", true, true, true)},
		},
		reported: []string{"a"}, reportedOut: 1, minAvailable: 2, minAtDisrupt: 3,
	}, {
		name: "a report on one replica does not excuse taking out another",
		events: []ev{
			{watch.Modified, replica("a", true, true, false)},
			{watch.Modified, replica("b", true, true, false)},
		},
		reported: []string{"a"}, reportedOut: 1, violations: 1, disrupts: 1, minAvailable: 1, minAtDisrupt: 1,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w := &PoolWatch{objs: map[string]*crawlv1.Proxy{}, seen: map[string]ProxyRef{}}
			for _, n := range []string{"a", "b", "c"} {
				w.add(replica(n, true, false, false))
			}
			w.Arm(3, 1, 0)
			for _, n := range tc.reported {
				w.Reported(n)
			}
			for _, e := range tc.events {
				w.observe(e.t, e.p)
			}
			b := w.Budget()
			if len(b.Violations) != tc.violations || len(b.ReadyLost) != tc.lost || b.Disruptions != tc.disrupts ||
				b.MinAvailable != tc.minAvailable || b.MinAtDisruption != tc.minAtDisrupt || b.ReportedOut != tc.reportedOut {
				t.Errorf("got %d violations %v, %d Ready lost, %d disruptions, min available %d, min at disruption %d, %d reported out; want %d, %d, %d, %d, %d, %d",
					len(b.Violations), b.Violations, len(b.ReadyLost), b.Disruptions, b.MinAvailable, b.MinAtDisruption, b.ReportedOut,
					tc.violations, tc.lost, tc.disrupts, tc.minAvailable, tc.minAtDisrupt, tc.reportedOut)
			}
		})
	}
}
