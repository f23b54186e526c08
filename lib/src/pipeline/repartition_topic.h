#pragma once
// The repartition stage's topics at startup (repartition.h,
// Repartitioner::prepare_topics): the input and dead-letter topics must
// exist; the internal topic is created with repartition.partitions
// partitions when missing and allowed (librdkafka's admin CreateTopics),
// else checked. Runs once on the starting thread with the stage's producer.

#include <librdkafka/rdkafkacpp.h>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"

namespace kdedup::pipeline {

/// Errors name the config key to change (input.topics, dlq_topic,
/// repartition.topic, repartition.partitions), one per line.
[[nodiscard]] Status prepare_repartition_topics(RdKafka::Producer& producer,
                                                const config::Config& config);

}  // namespace kdedup::pipeline
