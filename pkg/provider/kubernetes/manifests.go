package kubernetes

import (
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// ReloadInterval is how often the squid container looks for a changed
// configuration (SquidCommand).
const ReloadInterval = 5 * time.Second

// reloader is the squid container's program (POSIX sh; $1 the config
// directory, $2 the interval in seconds). squid runs in the foreground
// (-N) and replaces the shell (exec), so it keeps the container's main
// process and its exit is the container's. Beside it, a loop compares a
// checksum of the directory's files every interval: the kubelet swaps a
// mounted ConfigMap's files all at once when it changes, and on a change
// squid checks the new files (squid -k parse) and re-reads them (SIGHUP,
// what squid -k reconfigure sends) without a restart. A change that does
// not parse is reported and squid keeps what it runs.
const reloader = `conf="$1/squid.conf"
sum() { cat "$1"/* 2>/dev/null | cksum; }
seen=$(sum "$1")
main=$$
(
  while sleep "$2" && kill -0 "$main" 2>/dev/null; do
    now=$(sum "$1")
    [ "$now" = "$seen" ] && continue
    seen=$now
    if out=$(squid -k parse -f "$conf" 2>&1); then
      echo "squid-reloader: the configuration changed; reconfiguring squid" >&2
      kill -HUP "$main"
    else
      echo "squid-reloader: the changed configuration does not parse, squid keeps the one it runs: $out" >&2
    fi
  done
) &
exec squid -N -f "$conf"
`

// SquidCommand is the squid container's command line, with the entrypoint
// of the image bypassed so the contract does not depend on it: squid in
// the foreground reading configDir/squid.conf, and a reloader that has it
// re-read the directory's files when they change (see reloader). The
// image needs /bin/sh, cat, cksum and sleep beside squid. See
// docs/providers.md.
func SquidCommand(configDir string) []string {
	return []string{"/bin/sh", "-c", reloader, "squid-reloader", configDir, strconv.Itoa(int(ReloadInterval / time.Second))}
}

func port(m *provider.Machine) int32 {
	if m.Port == 0 {
		return DefaultPort
	}
	return m.Port
}

func (p *Provider) meta(m *provider.Machine, k types.NamespacedName) metav1.ObjectMeta {
	objLabels := map[string]string{
		LabelManagedBy: ManagedBy,
		LabelAppName:   AppName,
		LabelTag:       m.Tag,
		LabelProxyUID:  m.UID,
		LabelProxyName: labelValue(m.Name),
	}
	if p.opts.InstallID != "" {
		objLabels[LabelInstall] = p.opts.InstallID
	}
	return metav1.ObjectMeta{
		Name:            k.Name,
		Namespace:       k.Namespace,
		Labels:          objLabels,
		Annotations:     map[string]string{AnnotationProxyName: m.Name},
		OwnerReferences: []metav1.OwnerReference{OwnerReference(m)},
	}
}

// OwnerReference makes the Proxy of m the controller owner. With
// BlockOwnerDeletion the operator needs update on proxies/finalizers.
func OwnerReference(m *provider.Machine) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{
		APIVersion:         ProxyAPIVersion,
		Kind:               ProxyKind,
		Name:               m.Name,
		UID:                types.UID(m.UID),
		Controller:         &yes,
		BlockOwnerDeletion: &yes,
	}
}

func (p *Provider) configMap(m *provider.Machine, f squidFiles) *corev1.ConfigMap {
	meta := p.meta(m, configKey(m))
	meta.Annotations[AnnotationDeniedDestinations] = formatPrefixes(f.Own)
	return &corev1.ConfigMap{
		ObjectMeta: meta,
		Data: map[string]string{
			ConfigKey:        string(f.Conf),
			ClusterRangesKey: string(squid.DeniedDestinationsFile(f.Cluster)),
			// Always there, so that a pod projecting it executable
			// (configVolume) can mount the ConfigMap whatever squid.conf
			// says; only squid.conf decides whether it runs.
			CounterKey: string(squid.UpstreamCounter),
		},
	}
}

func (p *Provider) secret(m *provider.Machine, f squidFiles) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: p.meta(m, configKey(m)),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{PasswordKey: f.Password},
	}
}

// networkPolicy admits the proxy port of m's pods from the allowed
// sources (ipBlock) and the manager's pods, and nothing else; it lets them
// reach DNS and what squid does not refuse (egressRules). Whether an
// ipBlock matches in-cluster pod addresses is the CNI's choice (Calico
// does; Cilium applies CIDR rules only to traffic from outside the
// cluster): docs/providers.md.
func (p *Provider) networkPolicy(m *provider.Machine, f squidFiles) *networkingv1.NetworkPolicy {
	var from []networkingv1.NetworkPolicyPeer
	for _, cidr := range f.Sources {
		from = append(from, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr}})
	}
	if p.opts.ManagerNamespace != "" {
		from = append(from, networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: p.opts.ManagerNamespace}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: p.opts.ManagerPodLabels},
		})
	}
	tcp := corev1.ProtocolTCP
	proxyPort := intstr.FromInt32(port(m))
	return &networkingv1.NetworkPolicy{
		ObjectMeta: p.meta(m, configKey(m)),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy, LabelProxyUID: m.UID}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  from,
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &proxyPort}},
			}},
			Egress: p.egressRules(slices.Concat(f.Own, f.Cluster)),
		},
	}
}

func (p *Provider) pod(m *provider.Machine, k types.NamespacedName, incarnation int, withPassword bool) *corev1.Pod {
	no, yes := false, true
	uid := SquidUID
	authMode := int32(0o440) // root:13 with fsGroup: readable by squid's helper, by nobody else
	grace := int64(10)       // squid is told to finish within 3s (shutdown_lifetime)
	res := corev1.ResourceList{}
	if m.CPUs > 0 {
		res[corev1.ResourceCPU] = *resource.NewQuantity(int64(m.CPUs), resource.DecimalSI)
	}
	if m.MemoryBytes > 0 {
		res[corev1.ResourceMemory] = *resource.NewQuantity(m.MemoryBytes, resource.BinarySI)
	}
	tcp := corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString(PortName)}}
	meta := p.meta(m, k)
	if incarnation > 0 {
		meta.Annotations[AnnotationIncarnation] = strconv.Itoa(incarnation)
	}
	var spread []corev1.TopologySpreadConstraint
	if m.SpreadGroup != "" {
		// A preference, not a rule: with DoNotSchedule, nodes that count
		// as domains but take no pod (tainted control planes) would leave
		// replicas Pending.
		group := spreadGroupValue(m.SpreadGroup)
		meta.Labels[LabelSpreadGroup] = group
		spread = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.ScheduleAnyway,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy, LabelSpreadGroup: group}},
		}}
	}
	pod := &corev1.Pod{
		ObjectMeta: meta,
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyAlways,
			// squid talks to no Kubernetes API; no token, no service env.
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			TopologySpreadConstraints:     spread,
			// The restricted Pod Security level, and a read-only root.
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				RunAsUser:      &uid,
				RunAsGroup:     &uid,
				FSGroup:        &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           p.opts.SquidImage,
				ImagePullPolicy: p.opts.ImagePullPolicy,
				Command:         SquidCommand(ConfigDir),
				Ports: []corev1.ContainerPort{{
					Name: PortName, ContainerPort: port(m), Protocol: corev1.ProtocolTCP,
				}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "config", MountPath: ConfigDir, ReadOnly: true},
					{Name: "state", MountPath: StateDir},
				},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:     tcp,
					PeriodSeconds:    5,
					TimeoutSeconds:   2,
					FailureThreshold: 2,
				},
				// Restarts a squid that stops accepting connections,
				// in place; generous, so a busy proxy is not killed.
				LivenessProbe: &corev1.Probe{
					ProbeHandler:        tcp,
					InitialDelaySeconds: 15,
					PeriodSeconds:       20,
					TimeoutSeconds:      5,
					FailureThreshold:    3,
				},
				Resources: corev1.ResourceRequirements{Requests: res, Limits: res.DeepCopy()},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					ReadOnlyRootFilesystem:   &yes,
				},
			}},
			Volumes: []corev1.Volume{
				configVolume(m),
				// A pid file and core dumps only: small, memory-backed.
				{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
					Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(16<<20, resource.BinarySI),
				}}},
			},
		},
	}
	if withPassword {
		c := &pod.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "auth", MountPath: AuthDir, ReadOnly: true})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "auth", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: configKey(m).Name, DefaultMode: &authMode,
		}}})
	}
	return pod
}

// configVolume projects the ConfigMap's files into ConfigDir: squid.conf
// and the cluster's ranges with the default mode, the upstream counter
// executable (CounterMode), so that a squid.conf naming it runs it.
func configVolume(m *provider.Machine) corev1.Volume {
	counterMode := CounterMode
	return corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: configKey(m).Name},
		Items: []corev1.KeyToPath{
			{Key: ConfigKey, Path: ConfigKey},
			{Key: ClusterRangesKey, Path: ClusterRangesKey},
			{Key: CounterKey, Path: CounterKey, Mode: &counterMode},
		},
	}}}
}

// runsCounter says whether pod has the upstream counter executable at
// CounterPath (configVolume). Pods made before the operator delivered it
// mount the whole ConfigMap with the default mode: a squid.conf naming the
// counter would stop their squid at its next reconfigure.
func runsCounter(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Name != "config" || v.ConfigMap == nil {
			continue
		}
		for _, item := range v.ConfigMap.Items {
			if item.Key == CounterKey && item.Path == CounterKey && item.Mode != nil && *item.Mode&0o111 == 0o111 {
				return true
			}
		}
	}
	return false
}
