// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// Options are what every command shares: the standard kubectl flags (kubeconfig,
// context, namespace and the rest of cli-runtime's ConfigFlags), the streams and
// the clock.
type Options struct {
	Streams genericiooptions.IOStreams
	Config  *genericclioptions.ConfigFlags
	// Now is the clock; time.Now by default.
	Now func() time.Time
}

// Main runs the plugin with args (without the program's name) and returns the exit
// code: 0, or 1 after printing the error on one line.
func Main(streams genericiooptions.IOStreams, args []string) int {
	cmd := NewCommand(&Options{Streams: streams, Config: genericclioptions.NewConfigFlags(true), Now: time.Now})
	cmd.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(streams.ErrOut, "error: %v\n", err)
		return 1
	}
	return 0
}

// NewCommand is `kubectl tokenwarden` and its commands.
func NewCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:           "kubectl-tokenwarden",
		Short:         "What a tokenwarden fleet enforces, and who uses how much of it",
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl tokenwarden"},
	}
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.SetOut(o.Streams.Out)
	cmd.SetErr(o.Streams.ErrOut)
	o.Config.AddFlags(cmd.PersistentFlags())
	cmd.AddCommand(newTopCommand(o), newStatusCommand(o), newWhyCommand(o), newExplainCommand(o), newSpendCommand(o))
	return cmd
}

// scheme holds the types the plugin reads.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = twv1alpha1.AddToScheme(s)
	return s
}

// client is a client of the API server of the caller's kubeconfig, with watches.
func (o *Options) client() (client.WithWatch, error) {
	cfg, err := o.Config.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("read the kubeconfig: %w", err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme()})
	if err != nil {
		return nil, fmt.Errorf("connect to the API server: %w", err)
	}
	return c, nil
}

// namespace is the namespace of the command: --namespace, else the kubeconfig context's.
func (o *Options) namespace() (string, error) {
	ns, _, err := o.Config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("read the kubeconfig's namespace: %w", err)
	}
	return ns, nil
}

// scope is where a command reads: one namespace, or every namespace (-A).
type scope struct {
	namespace string
	all       bool
}

// where is the scope in words, for messages.
func (s scope) where() string {
	if s.all {
		return "in any namespace (-A)"
	}
	return fmt.Sprintf("in namespace %q", s.namespace)
}

// listOptions select the scope's objects.
func (s scope) listOptions() []client.ListOption {
	if s.all {
		return nil
	}
	return []client.ListOption{client.InNamespace(s.namespace)}
}

// readError says in one sentence why a read failed: a refusal names what the caller
// may not do, where; a missing API names the resource and says what installs it.
func readError(err error, verb, resource string, where string) error {
	var status apierrors.APIStatus
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("forbidden: you may not %s %s %s; ask for a Role that grants it, or use -n with a namespace you may read (the API server said: %s)",
			verb, resource, where, apiMessage(err))
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("unauthorized: the API server did not accept the kubeconfig's credentials to %s %s %s", verb, resource, where)
	case meta.IsNoMatchError(err):
		return fmt.Errorf("the cluster serves no %s: install tokenwarden's CRDs (config/crd, or the Helm chart)", resource)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("not found: %s %s (%s)", resource, where, apiMessage(err))
	case errors.As(err, &status):
		return fmt.Errorf("%s %s %s: %s", verb, resource, where, apiMessage(err))
	}
	return fmt.Errorf("%s %s %s: %w", verb, resource, where, err)
}

// apiMessage is the API server's message of a status error.
func apiMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Message != "" {
		return status.Status().Message
	}
	return err.Error()
}
