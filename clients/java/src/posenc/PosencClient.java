package posenc;

import com.google.gson.Gson;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.stream.JsonReader;
import com.google.gson.stream.JsonToken;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.StringReader;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Client of one posenc server (java.net.http, JSON with Gson): v1 tables as safetensors or raw tensors,
 * and KServe v2 inference with binary tensors.
 *
 * <pre>
 * PosencClient client = new PosencClient("http://127.0.0.1:8000");
 * Tensor cos = client.table("/v1/rope", Map.of("max_position", "8", "head_dim", "64")).tensors().get("cos");
 * double[] values = cos.toDoubles();   // row-major, shape cos.shape()
 * </pre>
 */
public final class PosencClient {
    /** A format=raw answer: the X-Tensor-Name header and the tensor. */
    public record NamedTensor(String name, Tensor tensor) {
    }

    /** Outputs of one inference, by name. */
    public record InferResult(String modelName, String id, Map<String, Tensor> outputs) {
    }

    private static final Gson GSON = new Gson();

    private final String baseUrl;
    private final HttpClient http;
    private final Duration timeout;

    public PosencClient(String baseUrl) {
        this(baseUrl, Duration.ofSeconds(30));
    }

    public PosencClient(String baseUrl, Duration timeout) {
        this.baseUrl = baseUrl.replaceAll("/+$", "");
        this.timeout = timeout;
        this.http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(timeout).build();
    }

    /** GET a v1 table (e.g. "/v1/rope") as safetensors: every tensor of the bundle and its metadata. */
    public Safetensors.File table(String path, Map<String, String> params) throws IOException, InterruptedException {
        Map<String, String> q = new LinkedHashMap<>(params);
        q.put("format", "safetensors");
        return Safetensors.parse(send(get(path, q)).body());
    }

    /** GET one tensor of a v1 table with format=raw ({@code tensor} null for one-tensor tables). */
    public NamedTensor rawTensor(String path, Map<String, String> params, String tensor)
            throws IOException, InterruptedException {
        Map<String, String> q = new LinkedHashMap<>(params);
        q.put("format", "raw");
        if (tensor != null) {
            q.put("tensor", tensor);
        }
        HttpResponse<byte[]> r = send(get(path, q));
        String dtype = r.headers().firstValue("X-Tensor-Dtype").orElseThrow();
        String shapeText = r.headers().firstValue("X-Tensor-Shape").orElse("");
        long[] shape = shapeText.isEmpty() ? new long[0]
                : java.util.Arrays.stream(shapeText.split(",")).mapToLong(s -> Long.parseLong(s.trim())).toArray();
        return new NamedTensor(r.headers().firstValue("X-Tensor-Name").orElse(""),
                new Tensor(DType.of(dtype), shape, r.body()));
    }

    /**
     * Run {@code model} with the binary tensor extension: JSON header, then each input's bytes, with
     * Inference-Header-Content-Length saying where the header ends; outputs come back binary too.
     */
    public InferResult infer(String model, Map<String, Tensor> inputs, String id)
            throws IOException, InterruptedException {
        JsonObject header = new JsonObject();
        if (id != null) {
            header.addProperty("id", id);
        }
        JsonArray specs = new JsonArray();
        ByteArrayOutputStream payload = new ByteArrayOutputStream();
        for (Map.Entry<String, Tensor> e : inputs.entrySet()) {
            Tensor t = e.getValue();
            JsonArray shape = new JsonArray();
            for (long d : t.shape()) {
                shape.add(d);
            }
            JsonObject spec = new JsonObject();
            spec.addProperty("name", e.getKey());
            spec.add("shape", shape);
            spec.addProperty("datatype", t.dtype().kserve);
            JsonObject parameters = new JsonObject();
            parameters.addProperty("binary_data_size", t.data().length);
            spec.add("parameters", parameters);
            specs.add(spec);
            payload.write(t.data());
        }
        header.add("inputs", specs);
        JsonObject parameters = new JsonObject();
        parameters.addProperty("binary_data_output", true);
        header.add("parameters", parameters);
        byte[] head = header.toString().getBytes(StandardCharsets.UTF_8);
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        body.write(head);
        payload.writeTo(body);
        HttpRequest request = HttpRequest.newBuilder(URI.create(baseUrl + "/v2/models/" + encode(model) + "/infer"))
                .timeout(timeout)
                .header("Content-Type", "application/octet-stream")
                .header("Inference-Header-Content-Length", Integer.toString(head.length))
                .POST(HttpRequest.BodyPublishers.ofByteArray(body.toByteArray()))
                .build();
        HttpResponse<byte[]> r = send(request);
        return parseInferResponse(r.body(), r.headers().firstValue("Inference-Header-Content-Length").orElse(null));
    }

    /** A v2 infer response: a JSON header of {@code headerLength} bytes, then the binary outputs in order. */
    public static InferResult parseInferResponse(byte[] body, String headerLength) {
        int n = headerLength == null ? body.length : Integer.parseInt(headerLength);
        if (n < 0 || n > body.length) {
            throw new IllegalArgumentException("Inference-Header-Content-Length " + n + " past the body");
        }
        JsonObject doc = parseObject(new String(body, 0, n, StandardCharsets.UTF_8));
        Map<String, Tensor> outputs = new LinkedHashMap<>();
        int offset = n;
        for (JsonElement o : doc.getAsJsonArray("outputs")) {
            JsonObject out = o.getAsJsonObject();
            String name = out.get("name").getAsString();
            JsonElement size = out.has("parameters") && out.get("parameters").isJsonObject()
                    ? out.getAsJsonObject("parameters").get("binary_data_size") : null;
            if (size == null || !size.isJsonPrimitive() || !size.getAsJsonPrimitive().isNumber()) {
                throw new IllegalArgumentException("output " + name + " is not binary");
            }
            int bytes = size.getAsInt();
            if (bytes < 0 || offset + bytes > body.length) {
                throw new IllegalArgumentException("output " + name + " runs past the body");
            }
            byte[] data = java.util.Arrays.copyOfRange(body, offset, offset + bytes);
            offset += bytes;
            outputs.put(name, new Tensor(DType.of(out.get("datatype").getAsString()),
                    Safetensors.longs(out.getAsJsonArray("shape")), data));
        }
        return new InferResult(text(doc, "model_name"), text(doc, "id"), outputs);
    }

    /**
     * One JSON object, strictly (RFC 8259: no comments, unquoted names or trailing text, which Gson's
     * lenient default would accept); JsonParseException on anything else.
     */
    public static JsonObject parseObject(String text) {
        try (JsonReader reader = new JsonReader(new StringReader(text))) {
            reader.setLenient(false);
            JsonElement value = GSON.getAdapter(JsonElement.class).read(reader);
            if (reader.peek() != JsonToken.END_DOCUMENT) {
                throw new JsonParseException("trailing characters after the JSON value");
            }
            if (!value.isJsonObject()) {
                throw new JsonParseException("not a JSON object");
            }
            return value.getAsJsonObject();
        } catch (IOException e) {
            throw new JsonParseException(e.getMessage(), e);
        }
    }

    /** A string member of {@code doc}, or null when absent or JSON null. */
    static String text(JsonObject doc, String name) {
        JsonElement v = doc.get(name);
        return v == null || v.isJsonNull() ? null : v.getAsString();
    }

    private HttpRequest get(String path, Map<String, String> params) {
        StringBuilder q = new StringBuilder();
        for (Map.Entry<String, String> e : params.entrySet()) {
            q.append(q.length() == 0 ? '?' : '&').append(encode(e.getKey())).append('=').append(encode(e.getValue()));
        }
        return HttpRequest.newBuilder(URI.create(baseUrl + path + q)).timeout(timeout).GET().build();
    }

    private static String encode(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }

    /** Sends the request; a status >= 300 becomes a PosencException with the envelope's message and type. */
    private HttpResponse<byte[]> send(HttpRequest request) throws IOException, InterruptedException {
        HttpResponse<byte[]> r = http.send(request, HttpResponse.BodyHandlers.ofByteArray());
        if (r.statusCode() >= 300) {
            String body = new String(r.body(), StandardCharsets.UTF_8);
            JsonObject doc = null;
            try {
                doc = parseObject(body);
            } catch (JsonParseException | IllegalStateException notJson) {
                // not the JSON envelope: keep the text
            }
            JsonElement message = doc == null ? null : doc.get("error");
            if (message != null && message.isJsonPrimitive() && message.getAsJsonPrimitive().isString()) {
                String type = doc.has("type") && doc.get("type").isJsonPrimitive() ? doc.get("type").getAsString() : "";
                throw new PosencException(r.statusCode(), type, message.getAsString());
            }
            throw new PosencException(r.statusCode(), "", body);
        }
        return r;
    }

    static ByteBuffer little(byte[] bytes) {
        return ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
    }
}
