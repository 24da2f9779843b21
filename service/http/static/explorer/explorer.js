// posenc explorer: builds the query of a family from the form, shows the service's PNG pictures of the
// table and of its properties, the properties summary (format=json metadata) and the exact URL and curl
// command of each (the GET families; M-RoPE's routes take a JSON body: /docs). Same-origin requests only;
// no libraries.
"use strict";

// SERVED as a parameter's value or choices: its `default` or `enum` in the table route's OpenAPI document
// (rope_type, dtype, num_buckets, ...): the page offers what the service accepts and starts from the
// service's own defaults, with no copy of its own. Other values are the page's starting points.
const SERVED = "served";
const FAMILIES = {
  rope: {
    table: "/v1/rope", properties: "/v1/properties/rope", tensor: "decay_bound",
    parameters: [
      ["max_position", 512], ["head_dim", 64], ["rope_theta", SERVED],
      ["rope_type", SERVED, SERVED],
      ["factor", ""], ["original_max_position_embeddings", ""], ["max_position_embeddings", ""],
      ["low_freq_factor", ""], ["high_freq_factor", ""], ["short_factor", ""], ["long_factor", ""],
      ["dtype", SERVED, SERVED],
    ],
  },
  sinusoidal: {
    table: "/v1/sinusoidal", properties: "/v1/properties/sinusoidal", tensor: "dot_product",
    parameters: [
      ["max_position", 256], ["dim", 64], ["variant", SERVED, SERVED], ["base", SERVED], ["dtype", SERVED, SERVED],
    ],
  },
  alibi: {
    table: "/v1/alibi/bias", properties: "/v1/properties/alibi", tensor: "slopes",
    parameters: [
      ["num_heads", 8], ["query_length", 64], ["key_length", 64],
      ["mode", SERVED, SERVED], ["dtype", SERVED, SERVED],
    ],
  },
  t5: {
    table: "/v1/t5/buckets", properties: "/v1/properties/t5", tensor: "boundaries",
    parameters: [
      ["query_length", 64], ["key_length", 64], ["bidirectional", "true", ["true", "false"]],
      ["num_buckets", SERVED], ["max_distance", SERVED],
    ],
  },
  deberta: {
    table: "/v1/deberta/buckets", properties: "/v1/properties/deberta", tensor: "boundaries",
    parameters: [
      ["query_length", 64], ["key_length", 512], ["position_buckets", SERVED], ["max_relative_positions", SERVED],
    ],
  },
  relative: {
    table: "/v1/relative/clipped", properties: "/v1/properties/relative", tensor: "boundaries",
    parameters: [["query_length", 64], ["key_length", 64], ["max_relative_position", 16]],
  },
  xlnet: {
    table: "/v1/relative/sinusoidal", properties: "/v1/properties/xlnet", tensor: "omega",
    parameters: [
      ["qlen", 64], ["klen", 128], ["d_model", 64], ["attn_type", SERVED, SERVED],
      ["bi_data", "false", ["false", "true"]], ["clamp_len", SERVED], ["dtype", SERVED, SERVED],
    ],
  },
  vision: {
    table: "/v1/rope/vision", properties: "/v1/properties/rope/vision", tensor: "inv_freq",
    parameters: [
      ["model", SERVED, SERVED], ["head_dim", 64], ["rope_theta", SERVED],
      ["image_size", 512], ["patch_size", 16], ["dtype", SERVED, SERVED],
    ],
  },
};

const $ = (id) => document.getElementById(id);
let timer = null;
let generation = 0;
let served = {};  // table route → parameter → {default, choices} from its OpenAPI schema
let presets = [];  // GET /v1/presets: every model preset and the routes it fills
// Lengths are the request's own: a preset does not set them in the form (RoPE's default, the whole context,
// is too large to draw).
const OWN_SIZES = new Set(["max_position", "query_length", "key_length", "qlen", "klen", "height", "width"]);

function enumOf(schema) {
  if (!schema) return null;
  if (Array.isArray(schema.enum)) return schema.enum.map(String);
  for (const option of schema.anyOf || []) {
    const found = enumOf(option);
    if (found) return found;
  }
  return null;
}

async function loadServed() {
  try {
    const response = await fetch("/openapi.json");
    const paths = (await response.json()).paths || {};
    for (const family of Object.values(FAMILIES)) {
      const parameters = {};
      for (const parameter of (paths[family.table] && paths[family.table].get || {}).parameters || []) {
        const schema = parameter.schema || {};
        parameters[parameter.name] = {
          default: schema.default === undefined || schema.default === null ? "" : String(schema.default),
          choices: enumOf(schema),
        };
      }
      served[family.table] = parameters;
    }
  } catch (exc) {
    served = {};  // fields start empty ("not given": the service's default applies)
  }
}

async function loadPresets() {
  try {
    presets = (await (await fetch("/v1/presets")).json()).presets || [];
  } catch (exc) {
    presets = [];  // the picker offers none; the parameters still work
  }
}

function fillPresets(name) {
  const select = $("preset");
  select.replaceChildren(new Option("none: the parameters below", ""));
  const route = `GET ${FAMILIES[name].table}`;
  for (const preset of presets) {
    if (preset.endpoints.includes(route)) select.add(new Option(`${preset.name} (${preset.model_id})`, preset.name));
  }
}

async function applyPreset() {
  const name = $("preset").value;
  if (name) {
    const response = await fetch(`/v1/presets/${encodeURIComponent(name)}`);
    const values = (await response.json()).parameters[`GET ${FAMILIES[$("family").value].table}`] || {};
    for (const element of $("parameters").querySelectorAll("input, select")) {
      if (OWN_SIZES.has(element.name)) continue;
      const value = element.name in values ? String(values[element.name]) : "";
      if (element.tagName === "SELECT" && value && ![...element.options].some((o) => o.value === value)) {
        element.add(new Option(value, value));
      }
      if (element.tagName === "SELECT" && !value) continue;  // a choice the preset leaves to the default
      element.value = value;
    }
  }
  schedule();
}

function buildForm(name) {
  const box = $("parameters");
  box.replaceChildren();
  const route = served[FAMILIES[name].table] || {};
  for (const [param, given, listed] of FAMILIES[name].parameters) {
    const known = route[param] || {default: "", choices: null};
    const value = given === SERVED ? known.default : given;
    const choices = listed === SERVED ? known.choices || [value] : listed;
    const label = document.createElement("label");
    label.textContent = param;
    let input;
    if (choices) {
      input = document.createElement("select");
      for (const choice of choices) input.add(new Option(choice, choice, false, choice === value));
    } else {
      input = document.createElement("input");
      input.type = "text";
      input.inputMode = "decimal";
      input.value = String(value);
      input.placeholder = "not given";
    }
    input.name = param;
    input.id = "param-" + param;
    label.append(input);
    box.append(label);
  }
}

function query() {
  const params = new URLSearchParams();
  if ($("preset").value) params.set("preset", $("preset").value);
  for (const element of $("parameters").querySelectorAll("input, select")) {
    if (element.value.trim() !== "") params.set(element.name, element.value.trim());
  }
  return params;
}

function absolute(path) {
  return new URL(path, window.location.href).href;
}

function showCommand(which, url, output) {
  const link = $(which + "-url");
  link.textContent = url;
  link.href = url;
  $(which + "-curl").textContent = `curl -sS -o ${output} '${url}'`;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function errorOf(url) {
  try {
    const response = await fetch(url);
    if (response.ok) return null;
    const body = await response.json();
    return `${response.status}: ${body.error}`;
  } catch (exc) {
    return String(exc);
  }
}

function loadPicture(img, url) {
  return new Promise((resolve) => {
    img.onload = () => resolve(null);
    img.onerror = () => errorOf(url).then((message) => resolve(message || "the picture did not load"));
    img.src = url;
  });
}

async function showSummary(url, mine) {
  const response = await fetch(url);
  const body = await response.json();
  if (mine !== generation) return null;
  if (!response.ok) return `${response.status}: ${body.error}`;
  const rows = $("summary").tBodies[0];
  rows.replaceChildren();
  const given = query();
  for (const [key, value] of Object.entries(body.metadata)) {
    if (given.has(key) || key === "posenc_version" || key === "endpoint") continue;
    const row = rows.insertRow();
    row.insertCell().textContent = key;
    row.insertCell().textContent = value;
  }
  return null;
}

async function redraw() {
  const mine = ++generation;
  document.body.dataset.state = "loading";
  const family = FAMILIES[$("family").value];
  const params = query().toString();
  const tableUrl = absolute(`${family.table}?${params}&format=png`);
  const propertiesUrl = absolute(`${family.properties}?${params}&format=png`);
  showCommand("table", tableUrl, "table.png");
  showCommand("properties", propertiesUrl, "properties.png");
  const summaryUrl = absolute(`${family.properties}?${params}&format=json&tensor=${family.tensor}`);
  const problems = await Promise.all([
    loadPicture($("table-picture"), tableUrl),
    loadPicture($("properties-picture"), propertiesUrl),
    showSummary(summaryUrl, mine),
  ]);
  if (mine !== generation) return;
  const message = problems.filter(Boolean).join("\n");
  showError(message);
  document.body.dataset.state = message ? "error" : "ready";
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(redraw, 300);
}

async function start() {
  await Promise.all([loadServed(), loadPresets()]);
  const select = $("family");
  for (const name of Object.keys(FAMILIES)) select.add(new Option(name, name));
  const wanted = new URLSearchParams(window.location.search).get("family");
  if (wanted && FAMILIES[wanted]) select.value = wanted;
  buildForm(select.value);
  fillPresets(select.value);
  select.addEventListener("change", () => { buildForm(select.value); fillPresets(select.value); schedule(); });
  $("preset").addEventListener("change", applyPreset);
  $("parameters").addEventListener("input", schedule);
  $("parameters").addEventListener("change", schedule);
  $("controls").addEventListener("submit", (event) => { event.preventDefault(); redraw(); });
  redraw();
}

start();
