package v1alpha1

import (
	"context"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
)

func withExceptions(p *crawlv1.Proxy, exceptions ...string) *crawlv1.Proxy {
	p.Spec.Access.AllowedDestinationExceptions = exceptions
	return p
}

// TestDestinationExceptionsNeedTheOperatorForHostLocalRanges: a Proxy
// (and a ProxyPool's template) may not except loopback, link-local or the
// metadata address unless the manager grants it; private exceptions are
// admitted with a warning naming the field; a stored Proxy with a refused
// exception is still released (ratchet).
func TestDestinationExceptionsNeedTheOperatorForHostLocalRanges(t *testing.T) {
	ctx := context.Background()
	w := proxyWebhook(false)
	_, err := w.ValidateCreate(ctx, withExceptions(kvmProxy(), "10.9.0.0/16", "169.254.169.254/32"))
	checkErrs(t, err, "spec.access.allowedDestinationExceptions[1]: Forbidden")
	checkErrs(t, err, "--allow-destination-exceptions")

	granted := proxyWebhook(false)
	if granted.DestinationExceptionGrants, err = proxyaccess.ParseGrants("169.254.169.254/32"); err != nil {
		t.Fatal(err)
	}
	warnings, err := granted.ValidateCreate(ctx, withExceptions(kvmProxy(), "169.254.169.254/32"))
	checkErrs(t, err, "")
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0], "spec.access.allowedDestinationExceptions[0] is 169.254.169.254/32") {
		t.Errorf("granted exception: warnings %q, want one naming the field", warnings)
	}

	warnings, err = w.ValidateCreate(ctx, withExceptions(kvmProxy(), "10.9.0.0/16"))
	checkErrs(t, err, "")
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0], "spec.access.allowedDestinationExceptions[0] is 10.9.0.0/16") {
		t.Errorf("private exception: warnings %q, want one naming the field", warnings)
	}

	stored := withExceptions(kvmProxy(), "127.0.0.1/32")
	p := stored.DeepCopy()
	p.Labels = map[string]string{"released": "yes"}
	if _, err := w.ValidateUpdate(updateCtx(t, stored), stored, p); err != nil {
		t.Errorf("a stored Proxy with a refused exception cannot be updated: %v", err)
	}

	pool := goodPool()
	pool.Spec.Template.Spec.Access.AllowedDestinationExceptions = []string{"fe80::/64"}
	_, err = poolWebhook().ValidateCreate(ctx, pool)
	checkErrs(t, err, "spec.template.spec.access.allowedDestinationExceptions[0]: Forbidden")
	checkErrs(t, err, "--allow-destination-exceptions")
	pool.Spec.Template.Spec.Access.AllowedDestinationExceptions = []string{"192.168.7.0/24"}
	warnings, err = poolWebhook().ValidateCreate(ctx, pool)
	checkErrs(t, err, "")
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0], "spec.template.spec.access.allowedDestinationExceptions[0] is 192.168.7.0/24") {
		t.Errorf("pool with a private exception: warnings %q, want one naming the template's field", warnings)
	}
}

// TestUserDataRefusedWhenTheInstallationSaysSo: with
// --allow-proxy-user-data=false every cloud-init field is refused, naming
// the field and the flag, on Proxies and ProxyPool templates; by default
// it is admitted as before.
func TestUserDataRefusedWhenTheInstallationSaysSo(t *testing.T) {
	ctx := context.Background()
	refusing := proxyWebhook(false)
	refusing.RefuseUserData = true
	for field, set := range map[string]func(*crawlv1.ProxyCloudInit){
		"userData":       func(c *crawlv1.ProxyCloudInit) { c.UserData = "#cloud-config\n" },
		"userDataBase64": func(c *crawlv1.ProxyCloudInit) { c.UserDataBase64 = []byte{0x1f, 0x8b} },
		"vendorData":     func(c *crawlv1.ProxyCloudInit) { c.VendorData = "#cloud-config\n" },
	} {
		p := kvmProxy()
		set(&p.Spec.CloudInit)
		_, err := refusing.ValidateCreate(ctx, p)
		checkErrs(t, err, "spec.cloudInit."+field+": Forbidden")
		checkErrs(t, err, "--allow-proxy-user-data=false")
		_, err = proxyWebhook(false).ValidateCreate(ctx, p)
		checkErrs(t, err, "")

		pool := goodPool()
		set(&pool.Spec.Template.Spec.CloudInit)
		_, err = (&ProxyPoolWebhook{Proxy: *refusing}).ValidateCreate(ctx, pool)
		checkErrs(t, err, "spec.template.spec.cloudInit."+field+": Forbidden")
	}
	if _, err := refusing.ValidateCreate(ctx, kvmProxy()); err != nil {
		t.Errorf("a Proxy without cloud-init refused: %v", err)
	}
}

var _ = Describe("the operator's own destination exceptions, through the API server", func() {
	It("refuses a Proxy that excepts the metadata address, naming the field and the flag", func() {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "wh-"}}
		Expect(k8sClient.Create(ctx, n)).To(Succeed())
		a := sources("10.0.0.0/8")
		a.AllowedDestinationExceptions = []string{"169.254.169.254/32"}
		p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "metadata", Namespace: n.Name},
			Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Access: a}}
		err := k8sClient.Create(ctx, p)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("spec.access.allowedDestinationExceptions[0]: Forbidden"))
		Expect(err.Error()).To(ContainSubstring("--allow-destination-exceptions"))

		p.Spec.Access.AllowedDestinationExceptions = []string{"10.96.0.0/12"}
		warnings.take()
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		Expect(warnings.take()).To(ContainElement(HavePrefix("spec.access.allowedDestinationExceptions[0] is 10.96.0.0/12")))
	})
})
