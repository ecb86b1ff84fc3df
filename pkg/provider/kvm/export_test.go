package kvm

// ParsedSecrets is how many Secrets' parsed material k holds.
func (k *KubeHosts) ParsedSecrets() int {
	k.parsedMu.Lock()
	defer k.parsedMu.Unlock()
	return len(k.parsed)
}
