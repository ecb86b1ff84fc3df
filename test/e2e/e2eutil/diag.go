package e2eutil

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
)

// Dump writes what a failed run needs to be understood: the manager's log
// tail, the objects as the API server has them, the namespace's events, and
// from the hypervisor its domains, the guest's serial console and qemu log.
func Dump(ctx context.Context, w io.Writer, op Operator, h Host, o *Objects, serialLog string) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	section := func(title string) { fmt.Fprintf(w, "\n===== %s =====\n", title) }

	if op != nil {
		section("manager log (last 150 lines" + pathNote(op.LogPath()) + ")")
		fmt.Fprint(w, op.LogTail(ctx, 150))
		if o != nil {
			c := op.Client()
			for _, obj := range []client.Object{o.Host.DeepCopy(), o.Image.DeepCopy(), o.Proxy.DeepCopy()} {
				name := obj.GetName()
				if obj.GetNamespace() != "" {
					name = obj.GetNamespace() + "/" + name
				}
				section(reflect.TypeOf(obj).Elem().Name() + " " + name)
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
					fmt.Fprintln(w, err)
					continue
				}
				obj.SetManagedFields(nil)
				b, _ := yaml.Marshal(obj)
				fmt.Fprint(w, string(b))
			}
			section("events in namespace " + o.Namespace.Name)
			events := &corev1.EventList{}
			if err := c.List(ctx, events, client.InNamespace(o.Namespace.Name)); err != nil {
				fmt.Fprintln(w, err)
			}
			sort.Slice(events.Items, func(i, j int) bool {
				return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp)
			})
			for _, e := range events.Items {
				fmt.Fprintf(w, "%s %s %s/%s %s: %s\n", e.LastTimestamp.Format(time.RFC3339), e.Type,
					e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
	if h == nil {
		return
	}
	section("hypervisor: virsh list --all")
	if out, err := Virsh(ctx, h, "list", "--all"); err != nil {
		fmt.Fprintln(w, err)
	} else {
		fmt.Fprint(w, out)
	}
	if o == nil {
		return
	}
	dom := domxml.DomainName(o.Proxy.Namespace, o.Proxy.Name)
	if serialLog != "" {
		section("guest serial console (last 120 lines of " + serialLog + ")")
		fmt.Fprint(w, Tail(serialLog, 120))
	}
	if p := h.LocalPath("/var/log/libvirt/qemu/" + dom + ".log"); p != "" {
		section("qemu log of " + dom + " (last 40 lines of " + p + ")")
		fmt.Fprint(w, Tail(p, 40))
	}
	if d := h.LogDir(); d != "" {
		fmt.Fprintf(w, "\nhypervisor logs (kept after teardown): %s\n", d)
		if p := h.LocalPath("/var/log/libvirt/libvirtd.log"); p != "" {
			fmt.Fprintf(w, "libvirtd log: %s (the teardown removes it; test/e2e/run.sh first copies the host's /var/log into its run directory, host-varlog/)\n", p)
		}
	}
}

func pathNote(p string) string {
	if p == "" {
		return ""
	}
	return " of " + filepath.Clean(p)
}
