package posenc;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Tests of the Java client against a live posenc server (no test framework: plain checks).
 *
 * <pre>
 * POSENC_URL=http://127.0.0.1:8000 POSENC_FIXTURES=fixtures.json java -cp build posenc.PosencClientTest
 * </pre>
 *
 * POSENC_FIXTURES is written by scripts/client_fixtures.py (tables computed by the service in-process,
 * inference outputs by onnxruntime run on the model file); scripts/clients-test.sh does all of it.
 * Prints one line per test and "N passed, N failed"; exits 1 on any failure.
 */
public final class PosencClientTest {
    private interface Body {
        void run() throws Exception;
    }

    private static PosencClient client;
    private static JsonObject fixtures;
    private static final Map<String, String> ROPE = Map.of("max_position", "4", "head_dim", "8");

    private static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    private static Tensor fixtureTensor(JsonElement o) {
        JsonObject doc = o.getAsJsonObject();
        return new Tensor(DType.of(doc.get("dtype").getAsString()), Safetensors.longs(doc.getAsJsonArray("shape")),
                Base64.getDecoder().decode(doc.get("b64").getAsString()));
    }

    private static boolean same(Tensor a, Tensor b) {
        return a.dtype() == b.dtype() && Arrays.equals(a.shape(), b.shape()) && Arrays.equals(a.data(), b.data());
    }

    private static void ropeSafetensors() throws Exception {
        Safetensors.File file = client.table("/v1/rope", ROPE);
        check(file.tensors().keySet().containsAll(List.of("cos", "sin", "inv_freq")) && file.tensors().size() == 3,
                "tensors cos, sin, inv_freq: " + file.tensors().keySet());
        Tensor cos = file.tensors().get("cos");
        check(cos.dtype() == DType.FLOAT32 && Arrays.equals(cos.shape(), new long[] {4, 8}), "cos float32 [4, 8]");
        check(Math.abs(cos.toDoubles()[8] - Math.cos(1)) < 1e-6, "cos[1,0] == cos(1): " + cos.toDoubles()[8]);
        check(!file.metadata().getOrDefault("posenc_version", "").isEmpty(), "metadata posenc_version");
    }

    private static void ropeRawHalf() throws Exception {
        for (Map.Entry<String, Double> c : Map.of("float16", 1e-3, "bfloat16", 4e-3).entrySet()) {
            Map<String, String> p = new LinkedHashMap<>(ROPE);
            p.put("dtype", c.getKey());
            PosencClient.NamedTensor t = client.rawTensor("/v1/rope", p, "cos");
            check(t.name().equals("cos") && t.tensor().dtype().serviceName.equals(c.getKey())
                    && Arrays.equals(t.tensor().shape(), new long[] {4, 8}), "raw headers of " + c.getKey());
            double v = t.tensor().toDoubles()[8];
            check(Math.abs(v - Math.cos(1)) < c.getValue() && v != (double) (float) Math.cos(1),
                    "cos[1,0] rounded to " + c.getKey() + ": " + v);
        }
    }

    private static void alibiAndT5() throws Exception {
        double[] s = client.table("/v1/alibi/slopes", Map.of("num_heads", "8")).tensors().get("slopes").toDoubles();
        check(s.length == 8 && s[0] == 0.5 && s[1] == 0.25 && s[7] == 1.0 / 256, "slopes " + Arrays.toString(s));
        PosencClient.NamedTensor b = client.rawTensor("/v1/t5/buckets", Map.of("query_length", "4", "key_length", "6"), null);
        long[] v = b.tensor().toLongs();
        // bidirectional, 32 buckets: key after query -> 16 + distance, before -> distance.
        check(b.name().equals("buckets") && v[0] == 0 && v[1] == 17 && v[6] == 1 && v[3 * 6 + 5] == 18,
                "t5 buckets " + Arrays.toString(v));
    }

    private static void fixtureTables() throws Exception {
        check(fixtures.getAsJsonArray("tables").size() >= 10, "at least 10 table cases in the fixtures");
        for (JsonElement o : fixtures.getAsJsonArray("tables")) {
            JsonObject c = o.getAsJsonObject();
            String endpoint = c.get("endpoint").getAsString();
            Map<String, String> params = new LinkedHashMap<>();
            c.getAsJsonObject("params").entrySet().forEach(p -> params.put(p.getKey(), p.getValue().getAsString()));
            Map<String, Tensor> got = client.table(endpoint, params).tensors();
            JsonObject tensors = c.getAsJsonObject("tensors");
            check(got.size() == tensors.size(), endpoint + ": tensor count");
            for (Map.Entry<String, JsonElement> e : tensors.entrySet()) {
                Tensor want = fixtureTensor(e.getValue());
                check(same(got.get(e.getKey()), want), "safetensors " + endpoint + " " + e.getKey());
                PosencClient.NamedTensor raw = client.rawTensor(endpoint, params, e.getKey());
                check(raw.name().equals(e.getKey()) && same(raw.tensor(), want), "raw " + endpoint + " " + e.getKey());
            }
        }
    }

    private static void errors() throws Exception {
        try {
            client.table("/v1/sinusoidal", Map.of("max_position", "0", "dim", "8"));
            check(false, "no exception");
        } catch (PosencException e) {
            check(e.status() == 422 && e.type().equals("invalid_parameter"), "422 invalid_parameter: " + e);
            check(e.serviceMessage().contains("max_position"), "message names max_position: " + e);
        }
        try {
            client.infer("no_such_model", Map.of("x", new Tensor(DType.FLOAT32, new long[] {1}, new byte[4])), null);
            check(false, "no exception");
        } catch (PosencException e) {
            check(e.status() == 404, "unknown model is 404: " + e);
        }
    }

    private static void infer() throws Exception {
        check(fixtures.get("infer").isJsonObject(), "the fixtures hold an inference case (a model in onnx/)");
        JsonObject c = fixtures.getAsJsonObject("infer");
        Map<String, Tensor> inputs = new LinkedHashMap<>();
        c.getAsJsonObject("inputs").entrySet().forEach(e -> inputs.put(e.getKey(), fixtureTensor(e.getValue())));
        PosencClient.InferResult r = client.infer(c.get("model").getAsString(), inputs, "java-client-test");
        JsonObject outputs = c.getAsJsonObject("outputs");
        check("java-client-test".equals(r.id()) && r.outputs().size() == outputs.size(), "id and outputs");
        for (Map.Entry<String, JsonElement> e : outputs.entrySet()) {
            Tensor want = fixtureTensor(e.getValue());
            Tensor got = r.outputs().get(e.getKey());
            check(got != null && got.dtype() == want.dtype() && Arrays.equals(got.shape(), want.shape()),
                    e.getKey() + ": dtype and shape");
            double[] g = got.toDoubles();
            double[] w = want.toDoubles();
            double worst = 0;
            for (int i = 0; i < w.length; i++) {
                worst = Math.max(worst, Math.abs(g[i] - w[i]));
            }
            // Same runtime and inputs; batching may change the summation order a little, never more.
            check(worst <= 1e-5, e.getKey() + ": max abs difference " + worst);
        }
    }

    private static void decoding() {
        check(Tensor.float16ToDouble((short) 0x3c00) == 1 && Tensor.float16ToDouble((short) 0xc000) == -2, "f16 1, -2");
        check(Tensor.float16ToDouble((short) 0x0001) == Math.scalb(1.0, -24), "f16 subnormal");
        check(Tensor.float16ToDouble((short) 0xfc00) == Double.NEGATIVE_INFINITY, "f16 -inf");
        Tensor bf = new Tensor(DType.BFLOAT16, new long[] {2}, new byte[] {(byte) 0x80, 0x3f, (byte) 0xa0, (byte) 0xc0});
        check(Arrays.equals(bf.toDoubles(), new double[] {1, -5}), "bf16 1, -5");
    }

    private static void strictJson() {
        JsonObject doc = PosencClient.parseObject("{\"a\": [1, -2.5e1, \"x\\u0041\", true, null]}");
        JsonArray a = doc.getAsJsonArray("a");
        check(a.size() == 5 && a.get(0).getAsInt() == 1 && a.get(1).getAsDouble() == -25
                && a.get(2).getAsString().equals("xA") && a.get(3).getAsBoolean() && a.get(4).isJsonNull(),
                "parsed: " + doc);
        for (String bad : List.of("{\"a\": 1} x", "{a: 1}", "{\"a\": 1 // c\n}", "[1]", "")) {
            try {
                PosencClient.parseObject(bad);
                check(false, "accepted " + bad);
            } catch (JsonParseException expected) {
                // refused, as it should be
            }
        }
    }

    /** The client's dtype table against models/dtypes.py (the fixtures' dtypes): name, spellings, size. */
    private static void dtypeTable() {
        Map<String, String> ours = new TreeMap<>();
        for (DType d : DType.values()) {
            ours.put(d.serviceName, d.safetensors + " " + d.kserve + " " + d.size);
        }
        Map<String, String> want = new TreeMap<>();
        for (JsonElement o : fixtures.getAsJsonArray("dtypes")) {
            JsonObject d = o.getAsJsonObject();
            want.put(d.get("name").getAsString(), d.get("safetensors").getAsString() + " "
                    + d.get("kserve").getAsString() + " " + d.get("size").getAsInt());
        }
        check(want.size() >= 13, "at least 13 dtypes in the fixtures");
        check(ours.equals(want), "dtype table: client " + ours + ", models/dtypes.py " + want);
    }

    public static void main(String[] args) throws Exception {
        String url = System.getenv("POSENC_URL");
        String path = System.getenv("POSENC_FIXTURES");
        if (url == null || path == null) {
            System.err.println("set POSENC_URL (a running server) and POSENC_FIXTURES (scripts/client_fixtures.py output)");
            System.exit(2);
        }
        client = new PosencClient(url);
        fixtures = PosencClient.parseObject(Files.readString(Path.of(path)));
        Map<String, Body> tests = new LinkedHashMap<>();
        tests.put("rope safetensors: cos(1) at row 1, col 0", PosencClientTest::ropeSafetensors);
        tests.put("rope raw float16 and bfloat16", PosencClientTest::ropeRawHalf);
        tests.put("alibi slopes and t5 buckets", PosencClientTest::alibiAndT5);
        tests.put("fixture tables byte for byte (safetensors and raw)", PosencClientTest::fixtureTables);
        tests.put("a 4xx is PosencException with the service's message", PosencClientTest::errors);
        tests.put("KServe v2 binary infer equals onnxruntime", PosencClientTest::infer);
        tests.put("float16/bfloat16 decoding", PosencClientTest::decoding);
        tests.put("JSON is read strictly (Gson, lenient mode off)", PosencClientTest::strictJson);
        tests.put("the dtype table matches models/dtypes.py", PosencClientTest::dtypeTable);
        List<String> failures = new ArrayList<>();
        for (Map.Entry<String, Body> t : tests.entrySet()) {
            try {
                t.getValue().run();
                System.out.println("ok   " + t.getKey());
            } catch (Exception | AssertionError e) {
                failures.add(t.getKey());
                System.out.println("FAIL " + t.getKey() + ": " + e);
            }
        }
        System.out.println((tests.size() - failures.size()) + " passed, " + failures.size() + " failed");
        System.exit(failures.isEmpty() ? 0 : 1);
    }
}
