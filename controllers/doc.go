// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package controllers reconciles TokenProxy fleets: it gathers the TokenBudgets and
// ApiKeys that reference a fleet and the Secrets of those keys, renders them into the
// proxy config document in a ConfigMap, runs the fleet's Deployment and Service, and
// writes the status of every object it read.
package controllers

// The operator's permissions, generated into config/rbac/role.yaml by `make manifests`.
//
// +kubebuilder:rbac:groups=tokenwarden.io,resources=tokenproxies;tokenbudgets;apikeys,verbs=get;list;watch
// +kubebuilder:rbac:groups=tokenwarden.io,resources=tokenproxies/status;tokenbudgets/status;apikeys/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=tokenwarden.io,resources=tokenproxies/finalizers,verbs=update
// +kubebuilder:rbac:groups=core,resources=configmaps;services;serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=core,resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=core,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterrolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=bind,resourceNames=system:auth-delegator
//
// The operator reads the proxies' report Leases and deletes stale ones; it holds create
// and patch as well because the proxy's Role grants them, and RBAC lets a creator
// grant only what it holds.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch
// The metrics endpoint's authentication and authorization (main.go, --metrics-secure).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups=monitoring.coreos.com,resources=servicemonitors,verbs=get;list;watch;create;update;patch;delete
