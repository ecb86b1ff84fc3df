package kubernetes

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"crawl.example.com/proxy-operator/pkg/provider"
)

func TestErrorClassification(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		name string
		err  error
		want provider.ErrorClass
	}{
		{"forbidden", apierrors.NewForbidden(gr, "x", errors.New("exceeded quota")), provider.ClassPermanent},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "x", field.ErrorList{field.Required(field.NewPath("spec"), "")}), provider.ClassPermanent},
		{"bad request", apierrors.NewBadRequest("nope"), provider.ClassPermanent},
		{"unauthorized", apierrors.NewUnauthorized("who"), provider.ClassPermanent},
		{"conflict", apierrors.NewConflict(gr, "x", errors.New("changed")), provider.ClassTransient},
		{"server timeout", apierrors.NewServerTimeout(gr, "create", 1), provider.ClassTransient},
		{"timeout", apierrors.NewTimeoutError("slow", 1), provider.ClassTransient},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), provider.ClassTransient},
		{"internal", apierrors.NewInternalError(errors.New("etcd")), provider.ClassTransient},
		{"unavailable", apierrors.NewServiceUnavailable("down"), provider.ClassTransient},
		{"not found", apierrors.NewNotFound(gr, "x"), provider.ClassNotFound},
		{"network", errors.New("dial tcp: connection refused"), provider.ClassTransient},
		{"deadline", context.DeadlineExceeded, provider.ClassTransient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
				Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return tc.err },
			}).Build()
			_, err := newProvider(c).Create(context.Background(), machine())
			wantClass(t, err, tc.want)
		})
	}

	t.Run("already exists but unreadable (cache lag)", func(t *testing.T) {
		c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
			Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
				return apierrors.NewAlreadyExists(schema.GroupResource{Resource: "configmaps"}, obj.GetName())
			},
		}).Build()
		_, err := newProvider(c).Create(context.Background(), machine())
		wantClass(t, err, provider.ClassTransient)
	})

	t.Run("delete refused", func(t *testing.T) {
		m := machine()
		base := newFake(t)
		if _, err := newProvider(base).Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		c := interceptor.NewClient(base, interceptor.Funcs{
			Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error {
				return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "x", errors.New("uid precondition failed"))
			},
		})
		wantClass(t, newProvider(c).Delete(context.Background(), m), provider.ClassTransient)
	})
}
