package cluster

// The commands "Install into a cluster" in docs/getting-started.md tells a
// user to type, in its order. The cluster suite (build tag e2e) runs
// exactly these, in a copy of the checkout's config/ and hack/webhook-cert.sh
// with KUBECONFIG set, and TestGettingStartedShowsTheSteps keeps the page
// saying the same.
var (
	StepWebhookCert = []string{"hack/webhook-cert.sh", "config/certs-selfsigned"}
	StepApply       = []string{"kubectl", "apply", "-k", "my-install"}
	StepRollout     = []string{"kubectl", "-n", "proxy-operator-system", "rollout", "status",
		"deployment/proxy-operator-controller-manager", "--timeout=5m"}
	StepNamespace      = []string{"kubectl", "create", "namespace", "crawl"}
	StepRestricted     = []string{"kubectl", "label", "namespace", "crawl", "pod-security.kubernetes.io/enforce=restricted"}
	StepProxy          = []string{"kubectl", "apply", "-f", "squid-a.yaml"}
	StepWaitProxyReady = []string{"kubectl", "-n", "crawl", "wait", "--for=condition=Ready", "proxy/squid-a", "--timeout=5m"}

	InstallSteps = [][]string{StepWebhookCert, StepApply, StepRollout, StepNamespace, StepRestricted, StepProxy, StepWaitProxyReady}
)
