// Package k8s holds wlproj's Kubernetes manifests: the replicas'
// kustomization (this directory, its settings in wlproj.env), the
// migration Job's (migrate/), the image they share (version/), the
// components an install may add (projections/, console/, tls/,
// networkpolicy/) and the Secrets they read (secrets.example.yaml).
// runbook.md, "Containers and Kubernetes", says how to use them.
//
// Its tests check them with no cluster: the kustomizations, and an overlay
// with every component as the runbook shows one, are built with
// kustomize's own library, as `kubectl apply -k` builds them, and every
// document, built or as written, is decoded strictly into the Kubernetes
// API's Go types (k8s.io/api: an unknown or misspelt field fails); then
// the settings, probes, ports, paths, grace period, memory and network
// policy are checked against the wlproj binary (its kong model, and the
// real binary answering on the probes' paths) and against the runbook; a
// changed setting must change the pod template, so that it rolls.
// TestPodUnderPodman runs the pod itself, every component on, under podman
// against the test stack (podman_test.go).
//
// It is a Go module of its own, as tools/bench/river is, so that wlproj's
// go.mod never depends on the Kubernetes API types or kustomize; `make
// test` runs its tests.
package k8s
