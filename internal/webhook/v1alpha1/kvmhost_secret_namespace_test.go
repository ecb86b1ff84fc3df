package v1alpha1

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

const managerNS = "proxy-operator-system"

func hostWithSecretIn(ns string) *crawlv1.KVMHost {
	h := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: "hv1"},
		Spec: crawlv1.KVMHostSpec{Address: "hv1:22", SSHKeySecretRef: &crawlv1.SecretReference{Name: "hv1-ssh", Namespace: ns}}}
	DefaultKVMHost(h)
	return h
}

// TestSSHSecretOnlyInTheManagerNamespace: a KVMHost may not make the manager
// read a Secret of another namespace.
func TestSSHSecretOnlyInTheManagerNamespace(t *testing.T) {
	w := &KVMHostWebhook{ManagerNamespace: managerNS}
	noRef := hostWithSecretIn("")
	noRef.Spec.SSHKeySecretRef = nil
	for _, tc := range []struct {
		name    string
		h       *crawlv1.KVMHost
		wantErr string
	}{
		{"manager namespace", hostWithSecretIn(managerNS), ""},
		{"another namespace", hostWithSecretIn("tenant-a"),
			`spec.sshKeySecretRef.namespace: Invalid value: "tenant-a": SSH Secrets are read only from the manager's namespace "proxy-operator-system"`},
		{"no Secret (the manager's --ssh-key-dir)", noRef, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := w.ValidateCreate(context.Background(), tc.h)
			checkErrs(t, err, tc.wantErr)
		})
	}

	// Ratcheted: a host stored with a Secret elsewhere is still released.
	stored := hostWithSecretIn("tenant-a")
	stored.Finalizers = []string{"crawl.example.com/kvmhost"}
	h := stored.DeepCopy()
	h.Finalizers = nil
	if _, err := w.ValidateUpdate(updateCtx(t, stored), stored, h); err != nil {
		t.Errorf("releasing a stored host refused: %v", err)
	}
	// Moving the Secret elsewhere is a new error.
	moved := hostWithSecretIn(managerNS)
	h = moved.DeepCopy()
	h.Spec.SSHKeySecretRef.Namespace = "tenant-b"
	_, err := w.ValidateUpdate(updateCtx(t, moved), moved, h)
	checkErrs(t, err, `spec.sshKeySecretRef.namespace: Invalid value: "tenant-b"`)
}
