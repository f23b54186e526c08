// render: renders a Helm chart's templates the way `helm template` does, for
// checking the kdedup chart where no helm binary is installed. It implements
// the parts of Helm's engine the chart uses: values.yaml coalesced with -f
// files, .Release, .Chart, .Capabilities, .Files.Get, .Template, and the
// functions include, tpl, required, fail, toYaml, fromYaml, toJson, fromJson,
// lookup (always empty, as in `helm template`) on top of sprig. Output is the
// rendered manifests separated by "---" with "# Source:" lines; NOTES.txt is
// written to the -notes file.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	sprig "github.com/Masterminds/sprig"
	yaml "gopkg.in/yaml.v2"
)

type valueFiles []string

func (v *valueFiles) String() string     { return strings.Join(*v, ",") }
func (v *valueFiles) Set(s string) error { *v = append(*v, s); return nil }

// jsonify turns yaml.v2 output into what Helm's sigs.k8s.io/yaml produces:
// string-keyed maps and float64 numbers.
func jsonify(v interface{}) interface{} {
	switch t := v.(type) {
	case map[interface{}]interface{}:
		m := map[string]interface{}{}
		for k, val := range t {
			m[fmt.Sprint(k)] = jsonify(val)
		}
		return m
	case map[string]interface{}:
		m := map[string]interface{}{}
		for k, val := range t {
			m[k] = jsonify(val)
		}
		return m
	case []interface{}:
		out := make([]interface{}, len(t))
		for i, val := range t {
			out[i] = jsonify(val)
		}
		return out
	case int:
		return float64(t)
	case int64:
		return float64(t)
	case uint64:
		return float64(t)
	default:
		return v
	}
}

func readYAML(file string) (map[string]interface{}, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var raw interface{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if raw == nil {
		return map[string]interface{}{}, nil
	}
	m, ok := jsonify(raw).(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("%s: top level is not a map", file)
	}
	return m, nil
}

// coalesce merges src over dst as Helm does for -f files: maps merge
// recursively, other values replace, null deletes the key.
func coalesce(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sm, sok := v.(map[string]interface{})
		dm, dok := dst[k].(map[string]interface{})
		if sok && dok {
			dst[k] = coalesce(dm, sm)
		} else {
			dst[k] = v
		}
	}
	return dst
}

func toYAML(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	var obj interface{}
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return ""
	}
	out, err := yaml.Marshal(obj)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(out), "\n")
}

type files map[string][]byte

func (f files) Get(name string) string { return string(f[name]) }

type apiVersions []string

func (a apiVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

func main() {
	var vals valueFiles
	chartDir := flag.String("chart", "", "chart directory")
	release := flag.String("release", "kdedup", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	notes := flag.String("notes", "", "write rendered NOTES.txt here")
	flag.Var(&vals, "f", "values file (repeatable)")
	flag.Parse()
	if err := run(*chartDir, *release, *namespace, *notes, vals); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(chartDir, release, namespace, notesFile string, vals []string) error {
	chartMeta, err := readYAML(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return err
	}
	values, err := readYAML(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return err
	}
	for _, f := range vals {
		over, err := readYAML(f)
		if err != nil {
			return err
		}
		values = coalesce(values, over)
	}
	chart := map[string]interface{}{}
	for k, v := range chartMeta {
		chart[strings.ToUpper(k[:1])+k[1:]] = v
	}
	chartName := fmt.Sprint(chartMeta["name"])

	chartFiles := files{}
	var templates []string
	err = filepath.Walk(chartDir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(chartDir, p)
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(rel, "templates/") {
			templates = append(templates, rel)
			return nil
		}
		data, err := os.ReadFile(p)
		chartFiles[rel] = data
		return err
	})
	if err != nil {
		return err
	}
	sort.Strings(templates)

	root := template.New("root")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = toYAML
	funcs["toJson"] = func(v interface{}) string { b, _ := json.Marshal(v); return string(b) }
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		var raw interface{}
		if err := yaml.Unmarshal([]byte(s), &raw); err != nil {
			return map[string]interface{}{"Error": err.Error()}
		}
		m, _ := jsonify(raw).(map[string]interface{})
		return m
	}
	funcs["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	funcs["fail"] = func(msg string) (string, error) { return "", errors.New(msg) }
	funcs["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return "", err
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	root.Funcs(funcs).Option("missingkey=zero")
	for _, rel := range templates {
		data, err := os.ReadFile(filepath.Join(chartDir, rel))
		if err != nil {
			return err
		}
		if _, err := root.New(path.Join(chartName, rel)).Parse(string(data)); err != nil {
			return err
		}
	}

	top := map[string]interface{}{
		"Values": values,
		"Chart":  chart,
		"Files":  chartFiles,
		"Release": map[string]interface{}{
			"Name": release, "Namespace": namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1,
		},
		"Capabilities": map[string]interface{}{
			"KubeVersion": map[string]interface{}{"Version": "v1.29.0", "Major": "1", "Minor": "29", "GitVersion": "v1.29.0"},
			"APIVersions": apiVersions{"v1", "apps/v1", "policy/v1", "autoscaling/v2", "monitoring.coreos.com/v1"},
			"HelmVersion": map[string]interface{}{"Version": "v3.14.0"},
		},
	}
	var out bytes.Buffer
	for _, rel := range templates {
		base := path.Base(rel)
		if strings.HasPrefix(base, "_") {
			continue
		}
		name := path.Join(chartName, rel)
		scope := map[string]interface{}{}
		for k, v := range top {
			scope[k] = v
		}
		scope["Template"] = map[string]interface{}{"Name": name, "BasePath": path.Join(chartName, "templates")}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, scope); err != nil {
			return err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if base == "NOTES.txt" {
			if notesFile != "" {
				if err := os.WriteFile(notesFile, []byte(text), 0o644); err != nil {
					return err
				}
			}
			continue
		}
		if strings.TrimSpace(text) == "" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, strings.TrimLeft(text, "\n"))
	}
	_, err = os.Stdout.Write(out.Bytes())
	return err
}
