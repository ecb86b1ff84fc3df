package metricsauth

import "testing"

func TestInsecureMetricsOnlyWhenChosen(t *testing.T) {
	secure := ServerOptions(":8443", true, nil)
	if !secure.SecureServing || secure.FilterProvider == nil {
		t.Errorf("secure options serve without TLS or without authn/authz: %+v", secure)
	}
	plain := ServerOptions(":8080", false, nil)
	if plain.SecureServing || plain.FilterProvider != nil {
		t.Errorf("--metrics-secure=false still asks for TLS or a filter: %+v", plain)
	}
}
