"""JSON schemas in the shapes of public structured-output benchmarks (JSONSchemaBench's
GitHub/Kubernetes/Snowplow/Glaive/WashingtonPost subsets, OpenAI strict function
schemas, LangChain/Pydantic exports): nested objects, arrays with bounds, enums,
anyOf/oneOf, $ref/$defs (recursive too), patterns, formats, optional fields."""


def obj(props, required=None, **kw):
    s = {"type": "object", "properties": props}
    if required is not None:
        s["required"] = required
    s.update(kw)
    return s


def strict(props):
    """OpenAI strict mode: every property required, no extras."""
    return obj(props, list(props), additionalProperties=False)


S = {"type": "string"}
I = {"type": "integer"}
N = {"type": "number"}
B = {"type": "boolean"}

HANDWRITTEN = [
    ("person", obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 130}, "email": S}, ["name", "age"])),
    ("strict_weather", strict({"location": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}})),
    ("strict_nullable", strict({"city": S, "zip": {"type": ["string", "null"]}, "population": {"type": ["integer", "null"]}})),
    ("json_object", {"type": "object"}),
    ("any_value", {}),
    ("bool_only", B),
    ("null_only", {"type": "null"}),
    ("top_array_of_ints", {"type": "array", "items": I, "maxItems": 6}),
    ("top_string", S),
    ("top_number", N),
    ("nested_address", obj({"name": S, "address": obj({"street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$"}}, ["street", "city"])}, ["name", "address"])),
    ("deep_nesting", obj({"a": obj({"b": obj({"c": obj({"d": obj({"e": I}, ["e"])}, ["d"])}, ["c"])}, ["b"])}, ["a"])),
    ("array_min_max", obj({"xs": {"type": "array", "items": N, "minItems": 2, "maxItems": 4}}, ["xs"])),
    ("array_exact", {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "minItems": 3, "maxItems": 3}),
    ("array_of_objects", {"type": "array", "items": obj({"id": I, "label": S}, ["id", "label"]), "minItems": 1, "maxItems": 3}),
    ("enum_mixed", {"enum": ["red", 1, 2.5, True, None, {"k": "v"}, [1, 2]]}),
    ("const_string", {"const": "fixed value"}),
    ("const_object", obj({"version": {"const": 2}, "kind": {"const": "Deployment"}}, ["version", "kind"])),
    ("anyof_scalars", {"anyOf": [I, B, {"type": "null"}]}),
    ("anyof_objects", {"anyOf": [obj({"cat": S}, ["cat"], additionalProperties=False), obj({"dog": I}, ["dog"], additionalProperties=False)]}),
    ("oneof_tagged", {"oneOf": [obj({"type": {"const": "circle"}, "r": N}, ["type", "r"]), obj({"type": {"const": "rect"}, "w": N, "h": N}, ["type", "w", "h"])]}),
    ("type_array", {"type": ["string", "integer", "boolean"]}),
    ("defs_ref", {"$defs": {"pt": obj({"x": N, "y": N}, ["x", "y"])}, "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}}, "required": ["from", "to"]}),
    ("definitions_ref", {"definitions": {"tag": {"type": "string", "maxLength": 8}}, "type": "array", "items": {"$ref": "#/definitions/tag"}, "maxItems": 4}),
    ("recursive_tree", {"$defs": {"node": obj({"value": I, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, ["value"])}, "$ref": "#/$defs/node"}),
    ("recursive_root", obj({"name": S, "sub": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, ["name", "sub"])),
    ("linked_list", {"$defs": {"cell": obj({"v": I, "next": {"anyOf": [{"$ref": "#/$defs/cell"}, {"type": "null"}]}}, ["v", "next"])}, "$ref": "#/$defs/cell"}),
    ("pattern_phone", obj({"phone": {"type": "string", "pattern": "^\\+?[0-9]{1,3}-[0-9]{3}-[0-9]{4}$"}}, ["phone"])),
    ("pattern_unanchored", obj({"code": {"type": "string", "pattern": "[A-Z]{3}[0-9]+"}}, ["code"])),
    ("pattern_alternation", {"type": "string", "pattern": "^(GET|POST|PUT|DELETE) /[a-z/]*$"}),
    ("string_lengths", obj({"short": {"type": "string", "maxLength": 3}, "long": {"type": "string", "minLength": 5, "maxLength": 9}}, ["short", "long"])),
    ("string_minlen", {"type": "string", "minLength": 2}),
    ("format_date", obj({"d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "date-time"}}, ["d", "t"])),
    ("format_uuid", obj({"id": {"type": "string", "format": "uuid"}}, ["id"])),
    ("int_bounds_neg", obj({"t": {"type": "integer", "minimum": -40, "maximum": 45}}, ["t"])),
    ("int_exclusive", obj({"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}}, ["n"])),
    ("num_bounds", obj({"p": {"type": "number", "minimum": 0, "maximum": 1}}, ["p"])),
    ("num_bounds_neg", obj({"x": {"type": "number", "minimum": -5.5, "maximum": 2.25}}, ["x"])),
    ("num_exclusive", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}),
    ("big_int_bound", {"type": "integer", "minimum": 1000000, "maximum": 99999999}),
    ("optional_all", obj({"a": S, "b": I, "c": B, "d": N})),
    ("optional_mixed", obj({"a": S, "b": I, "c": B, "d": N, "e": S}, ["b", "d"])),
    ("additional_true", obj({"id": I}, ["id"], additionalProperties=True)),
    ("additional_schema", obj({"id": I}, ["id"], additionalProperties={"type": "integer"})),
    ("additional_only", {"type": "object", "additionalProperties": {"type": "string", "maxLength": 6}}),
    ("additional_false", obj({"a": I, "b": S}, ["a"], additionalProperties=False)),
    ("prefix_items", {"type": "array", "prefixItems": [S, I, B], "items": False}),
    ("prefix_then_items", {"type": "array", "prefixItems": [{"const": "head"}], "items": I, "maxItems": 4}),
    ("tuple_draft4", {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array", "items": [S, N], "additionalItems": False}),
    ("allof_single", {"allOf": [obj({"k": S}, ["k"])]}),
    ("nullable_openapi_ignored", obj({"n": {"type": "integer", "nullable": True}}, ["n"])),
    ("unicode_keys", obj({"名前": S, "âge": I, "emoji😀": B}, ["名前", "âge", "emoji😀"])),
    ("escaped_keys", obj({"a\"b": I, "c\\d": S, "tab\tkey": B}, ["a\"b", "c\\d", "tab\tkey"])),
    ("unicode_enum", {"enum": ["café", "naïve", "日本語", "😀 smile"]}),
    ("enum_many", {"enum": [f"item_{i:03d}" for i in range(300)]}),
    ("enum_prefixes", {"enum": ["a", "ab", "abc", "abcd", "b"]}),
    ("enum_typed_filter", {"type": "string", "enum": ["a", 1, "b", None, 2.0]}),
    ("enum_integer_typed", {"type": "integer", "enum": [1, 2.0, 2.5, "x"]}),
    ("empty_object", obj({}, [], additionalProperties=False)),
    ("array_any", {"type": "array"}),
    ("array_empty_only", {"type": "array", "maxItems": 0}),
    ("items_true", {"type": "array", "items": True, "maxItems": 3}),
    ("glaive_function", obj({"name": {"const": "get_stock_price"}, "arguments": obj({"symbol": {"type": "string", "pattern": "^[A-Z]{1,5}$"}, "exchange": {"enum": ["NYSE", "NASDAQ"]}}, ["symbol"])}, ["name", "arguments"])),
    ("kubernetes_like", obj({
        "apiVersion": {"const": "v1"}, "kind": {"enum": ["Pod", "Service"]},
        "metadata": obj({"name": {"type": "string", "pattern": "^[a-z0-9-]{1,20}$"}, "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 10}}}, ["name"]),
        "spec": obj({"replicas": {"type": "integer", "minimum": 1, "maximum": 10}, "ports": {"type": "array", "items": obj({"port": {"type": "integer", "minimum": 1, "maximum": 65535}, "protocol": {"enum": ["TCP", "UDP"]}}, ["port"]), "maxItems": 2}})},
        ["apiVersion", "kind", "metadata"])),
    ("github_action_like", obj({
        "name": S, "on": {"anyOf": [{"type": "string", "enum": ["push", "pull_request"]}, {"type": "array", "items": {"enum": ["push", "pull_request", "schedule"]}, "maxItems": 3}]},
        "jobs": {"type": "object", "additionalProperties": obj({"runs-on": S, "steps": {"type": "array", "items": obj({"uses": S, "run": S}), "maxItems": 3}}, ["runs-on"])}},
        ["on", "jobs"])),
    ("snowplow_like", obj({"event_id": {"type": "string", "format": "uuid"}, "timestamp": {"type": "integer", "minimum": 0}, "value": {"type": ["number", "null"], "maximum": 1000000}, "category": {"type": "string", "maxLength": 32}}, ["event_id", "timestamp"], additionalProperties=False)),
    ("washingtonpost_like", obj({"headline": {"type": "string", "minLength": 1, "maxLength": 40}, "byline": {"type": "array", "items": S, "maxItems": 3}, "section": {"enum": ["politics", "sports", "tech", None]}, "published": {"type": "string", "format": "date-time"}}, ["headline", "section"])),
    ("langchain_pydantic", {"title": "Joke", "description": "Joke to tell user.", "type": "object", "properties": {"setup": {"title": "Setup", "description": "The setup", "type": "string"}, "punchline": {"title": "Punchline", "type": "string"}, "rating": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Rating"}}, "required": ["setup", "punchline"]}),
    ("pydantic_defs", {"$defs": {"Color": {"enum": ["red", "green"], "title": "Color", "type": "string"}, "Item": {"properties": {"name": {"type": "string"}, "color": {"$ref": "#/$defs/Color"}}, "required": ["name", "color"], "title": "Item", "type": "object"}}, "properties": {"items": {"items": {"$ref": "#/$defs/Item"}, "title": "Items", "type": "array", "maxItems": 3}}, "required": ["items"], "title": "Order", "type": "object"}),
    ("tool_call_args", strict({"query": {"type": "string", "maxLength": 50}, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}, "filters": {"type": "array", "items": strict({"field": S, "op": {"enum": ["eq", "lt", "gt"]}, "value": {"type": ["string", "number"]}}), "maxItems": 2}})),
    ("matrix", {"type": "array", "items": {"type": "array", "items": I, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}),
    ("geojson_point", obj({"type": {"const": "Point"}, "coordinates": {"type": "array", "items": {"type": "number", "minimum": -180, "maximum": 180}, "minItems": 2, "maxItems": 2}}, ["type", "coordinates"])),
    ("schema_keyword_noise", {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://example.com/x", "title": "T", "description": "D", "$comment": "c", "examples": [{"a": 1}], "type": "object", "properties": {"a": {"type": "integer", "deprecated": False, "readOnly": True}}, "required": ["a"]}),
    ("json_pointer_escape", {"$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "boolean"}}, "type": "array", "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}], "items": False}),
    ("ref_into_properties", obj({"a": {"type": "string", "enum": ["x", "y"]}, "b": {"$ref": "#/properties/a"}}, ["a", "b"])),
    ("anyof_with_refs", {"$defs": {"A": obj({"a": I}, ["a"], additionalProperties=False), "B": obj({"b": S}, ["b"], additionalProperties=False)}, "type": "array", "items": {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}, "maxItems": 3}),
    ("mutual_recursion", {"$defs": {"E": {"anyOf": [I, {"$ref": "#/$defs/L"}]}, "L": {"type": "array", "items": {"$ref": "#/$defs/E"}, "maxItems": 2}}, "$ref": "#/$defs/E"}),
    ("bool_schemas", obj({"anything": True, "n": I}, ["anything", "n"])),
    ("uniqueitems_false", {"type": "array", "items": I, "uniqueItems": False, "maxItems": 3}),
    ("x_extension", {"type": "string", "x-order": 1, "maxLength": 4}),
]

# Families: the same shape over a range of parameters.
FAMILIES = []
for lo, hi in [(0, 0), (0, 1), (1, 1), (1, 5), (3, 6), (0, 10)]:
    FAMILIES.append((f"array_bounds_{lo}_{hi}", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": lo, "maxItems": hi}))
for lo, hi in [(-1000, 1000), (-1, 0), (7, 7), (99, 101), (0, 65535), (-99999, -100)]:
    FAMILIES.append((f"int_range_{lo}_{hi}", {"type": "integer", "minimum": lo, "maximum": hi}))
for lo, hi in [(0.5, 0.75), (-10, -1), (100, 1000.5)]:
    FAMILIES.append((f"num_range_{lo}_{hi}", {"type": "number", "minimum": lo, "maximum": hi}))
for i, pat in enumerate(["^[a-z]+$", "^\\d{3}-\\d{2}-\\d{4}$", "^[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?$", "^#[0-9a-fA-F]{6}$",
                         "^(\\d{1,3}\\.){3}\\d{1,3}$", "^v[0-9]+\\.[0-9]+\\.[0-9]+(-[a-z]+)?$", "^[^@\\s]{1,10}@[^@\\s]{1,10}\\.[a-z]{2,4}$",
                         "^\\w+$", "^\\S{4,6}$", "^(yes|no|maybe)$", "^[\\u00c0-\\u00ff]{1,4}$", "^a*b?c+$"]):
    FAMILIES.append((f"pattern_{i}", {"type": "string", "pattern": pat}))
for n in [1, 2, 5, 20]:
    FAMILIES.append((f"enum_{n}", {"type": "string", "enum": [f"opt{k}" for k in range(n)]}))
for n in [1, 3, 6, 12]:
    props = {f"field_{k}": [S, I, N, B][k % 4] for k in range(n)}
    FAMILIES.append((f"flat_required_{n}", obj(props, list(props))))
    FAMILIES.append((f"flat_optional_{n}", obj(props, [p for k, p in enumerate(props) if k % 3 == 0])))
for d in [1, 2, 4]:
    s = I
    for k in range(d):
        s = {"type": "array", "items": s, "maxItems": 2}
    FAMILIES.append((f"nested_arrays_{d}", s))
for d in [2, 5]:
    s = {"type": "string", "maxLength": 5}
    for k in range(d):
        s = obj({f"l{k}": s, "n": I}, [f"l{k}"])
    FAMILIES.append((f"nested_objects_{d}", s))
for t in ["string", "integer", "number", "boolean", "object"]:
    FAMILIES.append((f"nullable_{t}", {"type": [t, "null"]}))

SCHEMAS = HANDWRITTEN + FAMILIES
