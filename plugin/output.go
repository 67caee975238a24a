// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
)

// outputFlags are -o and its companions: a table (the default, and wide), or
// cli-runtime's printers (json, yaml, jsonpath, go-template) of a v1 List of rows.
type outputFlags struct {
	print *genericclioptions.PrintFlags
}

func newOutputFlags() *outputFlags {
	return &outputFlags{print: genericclioptions.NewPrintFlags("")}
}

func (f *outputFlags) addFlags(cmd *cobra.Command) {
	f.print.AddFlags(cmd)
	cmd.Flags().Lookup("output").Usage = "Output format: wide, or one of " + strings.Join(f.print.AllowedFormats(), ", ") + "."
}

// format is -o's value.
func (f *outputFlags) format() string {
	if f.print.OutputFormat == nil {
		return ""
	}
	return *f.print.OutputFormat
}

// table reports whether the output is a table: the default, or wide.
func (f *outputFlags) table() bool { return f.format() == "" || f.format() == "wide" }

// wide reports whether the table has the wide columns.
func (f *outputFlags) wide() bool { return f.format() == "wide" }

// printRows prints rows with cli-runtime's printer for -o, as the items of a v1 List.
func (f *outputFlags) printRows(w io.Writer, rows any) error {
	data, err := json.Marshal(rows)
	if err != nil {
		return fmt.Errorf("encode the rows: %w", err)
	}
	var items []any
	if err := json.Unmarshal(data, &items); err != nil {
		return fmt.Errorf("encode the rows: %w", err)
	}
	if items == nil {
		items = []any{}
	}
	p, err := f.print.ToPrinter()
	if err != nil {
		return fmt.Errorf("-o %s: %w", f.format(), err)
	}
	list := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "List", "items": items}}
	if err := p.PrintObj(list, w); err != nil {
		return fmt.Errorf("print: %w", err)
	}
	return nil
}

// printTable prints a header and rows, aligned as kubectl aligns its tables.
func printTable(w io.Writer, header []string, rows [][]string) error {
	tw := printers.GetNewTabWriter(w)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("print: %w", err)
	}
	return nil
}
