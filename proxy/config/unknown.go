// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// unknownFields lists every field of the document that the Config type does not have,
// by its full path (rate_limiting.limits.per_user.tokens_per_minut), so a typo is named
// where it is.
func unknownFields(data []byte) []string {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil
	}
	var doc any
	if json.Unmarshal(js, &doc) != nil {
		return nil
	}
	var out []string
	walkUnknown(doc, reflect.TypeOf(Config{}), "", &out)
	sort.Strings(out)
	return out
}

func walkUnknown(v any, t reflect.Type, path string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" {
				fields[name] = f.Type
			}
		}
		for k, sub := range obj {
			ft, ok := fields[k]
			if !ok {
				*out = append(*out, join(path, k))
				continue
			}
			walkUnknown(sub, ft, join(path, k), out)
		}
	case reflect.Slice:
		arr, ok := v.([]any)
		if !ok {
			return
		}
		for i, sub := range arr {
			walkUnknown(sub, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out)
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return
		}
		for k, sub := range obj {
			walkUnknown(sub, t.Elem(), fmt.Sprintf("%s[%q]", path, k), out)
		}
	}
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}
