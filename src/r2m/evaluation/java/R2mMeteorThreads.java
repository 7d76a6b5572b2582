// r2m: METEOR 1.5 statistics for many segments on several threads of one JVM.
//
// The paraphrase and synonym tables are loaded once (one MeteorScorer); every further thread uses
// a MeteorScorer built with the jar's resource-sharing constructor MeteorScorer(MeteorScorer).
// Protocol on stdin/stdout (UTF-8), answers in input order:
//   SCORES <n>        then n lines "SCORE ||| ref1 ||| ... ||| hyp"  ->  n lines of statistics
//   EVAL ||| s1 ||| ...                                               ->  one score per segment, then the corpus score
// The SCORE and EVAL handling mirrors the jar's own -stdio mode (same split, trim, computeMetrics,
// corpus score from the summed statistics), so the output is the jar's.
import edu.cmu.meteor.scorer.MeteorConfiguration;
import edu.cmu.meteor.scorer.MeteorScorer;
import edu.cmu.meteor.scorer.MeteorStats;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

public class R2mMeteorThreads {
    public static void main(String[] args) throws Exception {
        int threads = Math.max(1, Integer.parseInt(args[0]));
        String[] meteorArgs = args.length > 1  // args[1]: a paraphrase table to use instead of the default
            ? new String[] {"-", "-", "-stdio", "-l", "en", "-norm", "-a", args[1]}
            : new String[] {"-", "-", "-stdio", "-l", "en", "-norm"};
        MeteorConfiguration config = new MeteorConfiguration(Meteor.createPropertiesFromArgs(meteorArgs, 2));
        MeteorScorer base = new MeteorScorer(config);
        MeteorScorer[] scorers = new MeteorScorer[threads];
        scorers[0] = base;
        for (int t = 1; t < threads; t++) scorers[t] = new MeteorScorer(base);
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        PrintStream out = new PrintStream(System.out, false, "UTF-8");
        String line;
        while ((line = in.readLine()) != null) {
            if (line.startsWith("SCORES ")) {
                int n = Integer.parseInt(line.substring(7).trim());
                final String[] lines = new String[n];
                for (int i = 0; i < n; i++) lines[i] = in.readLine();
                final String[] stats = new String[n];
                List<Future<?>> jobs = new ArrayList<>();
                for (int t = 0; t < threads; t++) {
                    final MeteorScorer scorer = scorers[t];
                    final int first = t;
                    final int step = threads;
                    jobs.add(pool.submit(() -> {
                        for (int i = first; i < lines.length; i += step) stats[i] = score(scorer, lines[i]);
                    }));
                }
                for (Future<?> job : jobs) job.get();
                for (String s : stats) out.println(s);
                out.flush();
            } else if (line.startsWith("EVAL")) {
                String[] parts = line.split("\\|\\|\\|");
                MeteorStats total = new MeteorStats();
                for (int i = 1; i < parts.length; i++) {
                    MeteorStats s = new MeteorStats(parts[i].trim());
                    base.computeMetrics(s);
                    out.println(s.score);
                    total.addStats(s);
                }
                base.computeMetrics(total);
                out.println(total.score);
                out.flush();
            } else {
                out.println("Error: expected SCORES <n> or EVAL");
                out.flush();
            }
        }
        pool.shutdown();
    }

    private static String score(MeteorScorer scorer, String line) {
        String[] parts = line.split("\\|\\|\\|");
        ArrayList<String> refs = new ArrayList<>();
        for (int i = 1; i < parts.length - 1; i++) refs.add(parts[i].trim());
        return scorer.getMeteorStats(parts[parts.length - 1].trim(), refs).toString();
    }
}
