package posenc;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Client of one posenc server (java.net.http only): v1 tables as safetensors or raw tensors, and
 * KServe v2 inference with binary tensors.
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
        Map<String, Object> header = new LinkedHashMap<>();
        if (id != null) {
            header.put("id", id);
        }
        List<Object> specs = new ArrayList<>();
        ByteArrayOutputStream payload = new ByteArrayOutputStream();
        for (Map.Entry<String, Tensor> e : inputs.entrySet()) {
            Tensor t = e.getValue();
            List<Object> shape = new ArrayList<>();
            for (long d : t.shape()) {
                shape.add(d);
            }
            specs.add(Map.of("name", e.getKey(), "shape", shape, "datatype", t.dtype().kserve,
                    "parameters", Map.of("binary_data_size", t.data().length)));
            payload.write(t.data());
        }
        header.put("inputs", specs);
        header.put("parameters", Map.of("binary_data_output", true));
        byte[] head = Json.write(header).getBytes(StandardCharsets.UTF_8);
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
    @SuppressWarnings("unchecked")
    public static InferResult parseInferResponse(byte[] body, String headerLength) {
        int n = headerLength == null ? body.length : Integer.parseInt(headerLength);
        if (n < 0 || n > body.length) {
            throw new IllegalArgumentException("Inference-Header-Content-Length " + n + " past the body");
        }
        Map<String, Object> doc = (Map<String, Object>) Json.parse(new String(body, 0, n, StandardCharsets.UTF_8));
        Map<String, Tensor> outputs = new LinkedHashMap<>();
        int offset = n;
        for (Object o : (List<Object>) doc.get("outputs")) {
            Map<String, Object> out = (Map<String, Object>) o;
            Map<String, Object> parameters = (Map<String, Object>) out.get("parameters");
            if (parameters == null || !(parameters.get("binary_data_size") instanceof Double)) {
                throw new IllegalArgumentException("output " + out.get("name") + " is not binary");
            }
            int size = ((Double) parameters.get("binary_data_size")).intValue();
            if (size < 0 || offset + size > body.length) {
                throw new IllegalArgumentException("output " + out.get("name") + " runs past the body");
            }
            byte[] data = java.util.Arrays.copyOfRange(body, offset, offset + size);
            offset += size;
            outputs.put((String) out.get("name"),
                    new Tensor(DType.of((String) out.get("datatype")), Safetensors.longs(out.get("shape")), data));
        }
        return new InferResult((String) doc.get("model_name"), (String) doc.get("id"), outputs);
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
    @SuppressWarnings("unchecked")
    private HttpResponse<byte[]> send(HttpRequest request) throws IOException, InterruptedException {
        HttpResponse<byte[]> r = http.send(request, HttpResponse.BodyHandlers.ofByteArray());
        if (r.statusCode() >= 300) {
            String text = new String(r.body(), StandardCharsets.UTF_8);
            try {
                if (Json.parse(text) instanceof Map<?, ?> doc && doc.get("error") instanceof String message) {
                    Object type = ((Map<String, Object>) doc).getOrDefault("type", "");
                    throw new PosencException(r.statusCode(), String.valueOf(type), message);
                }
            } catch (IllegalArgumentException notJson) {
                // not the JSON envelope: keep the text
            }
            throw new PosencException(r.statusCode(), "", text);
        }
        return r;
    }

    static ByteBuffer little(byte[] bytes) {
        return ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
    }
}
